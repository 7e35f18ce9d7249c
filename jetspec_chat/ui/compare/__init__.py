"""Compare budgets: rerun the last prompt at several budgets (and plain AR), side by side.

`state.py` holds a comparison and how the engine's reports change it, `runs.py` starts and
follows the runs on the chat's engine, `screen.py` edits the list and draws the results."""
from .runs import CompareRuns
from .screen import CompareScreen, draw_scaling_plot, format_duration
from .state import AR_LABEL, BudgetListError, CompareRow, CompareState, parse_budget_list

__all__ = ["AR_LABEL", "BudgetListError", "CompareRow", "CompareRuns", "CompareScreen", "CompareState",
           "draw_scaling_plot", "format_duration", "parse_budget_list"]
