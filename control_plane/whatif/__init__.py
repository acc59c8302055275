"""What-if: replay recorded traffic against a candidate limit before anyone is rejected.

:mod:`.recorder` records every replica's decided requests in Redis (bounded, sampled by
whole keys above a per-route budget); :mod:`.replay` runs them through the limiters' own
algorithm functions under a candidate policy; ``POST /v1/whatif`` and
``POST /v1/whatif/suggest`` (:mod:`control_plane.api.whatif`) answer with the figures.
"""

from .recorder import Recorder, key_point
from .replay import KeyFigures, ReplayResult, group_events, replay

__all__ = ["KeyFigures", "Recorder", "ReplayResult", "group_events", "key_point", "replay"]
