"""Whether a widget may be updated now.

Widgets are updated from timers and engine reports that do not know which screen is showing.
A widget whose compose has not run yet has no children to query, and a screen that was popped
has had its children removed while the Python object lives on. Every update from outside a
widget's own handlers goes through `can_update` first, so it never reaches either.
"""
from __future__ import annotations

from typing import Any

from textual.screen import Screen
from textual.widget import Widget


def can_update(widget: Widget | None) -> bool:
    """True when `widget` is mounted (composed), still attached to the app, not being removed,
    and its screen is on the app's screen stack (shown, or under a dialog)."""
    if widget is None or not widget.is_mounted or not widget.is_attached:
        return False
    if widget._closing or widget._pruning:
        return False
    try:
        screen = widget.screen
        return screen.is_attached and screen in widget.app.screen_stack
    except Exception:  # noqa: BLE001 - no screen (not in the DOM any more)
        return False


def dismiss_if_current(screen: Screen, result: Any = None) -> None:
    """Close `screen` if it is the one showing. A second Esc queued before the first one's pop
    lands on a screen already gone; dismissing again would pop the main screen (ScreenStackError)."""
    if screen.is_current:
        screen.dismiss(result)
