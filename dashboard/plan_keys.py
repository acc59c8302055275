"""The dashboard's keys on a route's rollout plan: ``x`` pauses a running plan or resumes a
paused one, ``a`` approves the step it waits at. Each asks a reason (audited), sends the
operator's word and says what the control plane answered; the plan line changes when the
control plane says so, never on a guess."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Static

from .client import ClientError
from .modals import ReasonDialog
from .models import RouteView
from .plan_views import PlanView, plan_strip

if TYPE_CHECKING:
    from .screen import DashboardScreen

__all__ = ["ConfirmPlanScreen", "plan_key", "plan_key_applies"]

_WHAT = {
    "pause": ("Pause", "The plan stops where it is: no step is applied until it is resumed."),
    "resume": ("Resume", "The plan goes on from its step (its time starts over)."),
    "approve": ("Approve", "The step the plan waits at is approved: the next step is applied now."),
}


class ConfirmPlanScreen(ReasonDialog):
    """Confirm pausing, resuming or approving a route's plan, with a required reason."""

    def __init__(self, route: RouteView, plan: PlanView, action: str) -> None:
        super().__init__()
        self.route, self.plan, self.action = route, plan, action
        self.CONFIRM = _WHAT[action][0]
        self.VARIANT = "warning" if action == "pause" else "primary"

    def compose(self) -> ComposeResult:
        title, what = _WHAT[self.action]
        with Vertical(classes="dialog"):
            yield Label(
                Text.assemble((f"{title} ", ""), (self.route.name, "bold"), ("'s rollout plan", "")),
                classes="dialog-title",
            )
            strip = plan_strip(self.plan)
            strip.append(f" · {self.plan.state.replace('_', ' ')}", style="dim")
            yield Static(strip, id="plan-strip")
            yield Static(what, id="plan-what")
            yield Label("Why?", classes="field-label")
            yield from self.reason_widgets()


def _action_for(plan: PlanView, key: str) -> str | None:
    """What a key does to the plan as it stands (None: nothing)."""
    if key == "approve":
        return "approve" if plan.state == "waiting_for_approval" else None
    if plan.can_pause:
        return "pause"
    return "resume" if plan.can_resume else None


def plan_key_applies(route: RouteView | None, key: str) -> bool:
    """Does ``key`` (``toggle`` or ``approve``) do something to the route's plan now?"""
    return route is not None and route.plan is not None and _action_for(route.plan, key) is not None


def plan_key(screen: DashboardScreen, key: str) -> None:
    """``x`` (``toggle``) or ``a`` (``approve``) on the route under the cursor."""
    if screen.read_only("Pausing, resuming or approving a plan"):
        return
    route = screen.route_at_cursor()
    if route is None or route.plan is None:
        screen.notify("This route has no rollout plan.", severity="warning")
        return
    action = _action_for(route.plan, key)
    if action is None:
        screen.notify(
            f"{route.name}'s plan is {route.plan.state.replace('_', ' ')}: nothing to do.", severity="warning"
        )
        return
    screen.run_worker(_send(screen, route, route.plan, action), exclusive=True, group="plan")


async def _send(screen: DashboardScreen, route: RouteView, plan: PlanView, action: str) -> None:
    reason = await screen.app.push_screen_wait(ConfirmPlanScreen(route, plan, action))
    if reason is None:
        return
    try:
        change = await screen.client.plan_action(route.name, action, reason=reason)
    except ClientError as exc:
        screen.refused(f"{route.name}'s plan not changed", exc)
        return
    screen.notify(
        f"{route.name}'s plan is {change.state.replace('_', ' ')} at {change.current}, confirmed by the control plane"
        f" (audit {change.audit_id}).",
        title={"pause": "Plan paused", "resume": "Plan resumed", "approve": "Step approved"}[action],
    )
    screen.refresh_routes()
