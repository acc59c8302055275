"""The error of a setting: what every part of the settings raises."""

from __future__ import annotations

__all__ = ["SettingsError"]


class SettingsError(ValueError):
    """A setting is invalid; the message names the environment variable."""
