"""The live speculation controls: budget, depth, width, tree algorithm, speculation on/off,
temperature and the settings dialog. Tree-shape changes reach the answer in progress from its
next round (through `EngineWorker.update_spec`); the rest applies from the next answer."""
from __future__ import annotations

from textual.app import App

from jetspec_chat.settings import Settings

from .chat_view import ChatView
from .controller import ChatController
from .dialogs import BUDGET_STEPS, SpecSettingsScreen, step_in

NO_HEAD_NOTE = "no draft head: speculation off (plain AR); pass --draft-head to speculate"


class SpeculationControls:
    """What F2-F5, ctrl+B and the palette's settings commands change (in `chat.settings`)."""

    def __init__(self, app: App, chat: ChatController, view: ChatView) -> None:
        """`app`: for notifications and the settings dialog."""
        self.app = app
        self.chat = chat
        self.view = view

    @property
    def settings(self) -> Settings:
        return self.chat.settings

    def changed(self, what: str, *, live: bool = True) -> None:
        """A setting changed. Tree-shape changes (`live`) reach the answer in progress from its
        next round; everything else applies from the next answer."""
        self.view.save_settings()
        suffix = ""
        if self.chat.chat_job is not None:
            suffix = " (from the next round)" if live and self.chat.push_live_speculation() else " (from the next answer)"
        self.app.notify(f"{what}{suffix}", timeout=2)
        self.view.refresh_chrome()

    def step_budget(self, direction: int) -> None:
        self.set_budget(step_in(BUDGET_STEPS, self.settings.budget, direction))

    def set_budget(self, budget: int) -> None:
        self.settings.budget = budget
        self.settings.budget_auto = False
        if not self.settings.speculation:
            self.settings.speculation = True
        self.changed(f"budget {budget}")

    def set_depth(self, depth: int | None) -> None:
        self.settings.depth = depth
        self.changed(f"depth {'full' if depth is None else depth}")

    def set_width(self, width: int) -> None:
        self.settings.width = width
        self.changed(f"width {width}")

    def set_algo(self, algo: str) -> None:
        self.settings.tree_algo = algo
        self.changed(f"tree algorithm {algo}")

    def next_algo(self) -> None:
        algos = list(self.chat.algos)
        i = algos.index(self.settings.tree_algo) if self.settings.tree_algo in algos else -1
        self.set_algo(algos[(i + 1) % len(algos)])

    def toggle_speculation(self) -> None:
        self.set_speculation(not self.settings.speculation)

    def set_speculation(self, on_: bool) -> None:
        if on_ and not self.chat.has_head:
            self.app.notify(NO_HEAD_NOTE, severity="warning")
            return
        self.settings.speculation = on_
        self.changed("speculation on" if on_ else "speculation off: plain AR")

    def set_temperature(self, t: float) -> None:
        self.settings.temperature = t
        self.changed("greedy decoding" if t <= 0 else f"temperature {t:g}", live=False)

    def toggle_thinking(self) -> None:
        self.settings.thinking = not self.settings.thinking
        self.changed(f"thinking {'on' if self.settings.thinking else 'off'} for new chats (ctrl+n)", live=False)

    def toggle_scores(self) -> None:
        self.settings.show_scores = not self.settings.show_scores
        self.view.tree_panel.show_scores = self.settings.show_scores
        self.view.save_settings()

    def toggle_provenance(self) -> None:
        self.settings.provenance = not self.settings.provenance
        self.view.save_settings()
        self.view.apply_provenance()
        self.app.notify("answer colored by provenance" if self.settings.provenance else "provenance colors off", timeout=2)

    def set_replay_speed(self, speed: float) -> None:
        self.settings.replay_speed = speed
        self.view.tree_panel.replay_speed = speed
        self.view.save_settings()

    def open_dialog(self) -> None:
        chat = self.chat

        def done(values: Settings | None) -> None:
            if values is None:
                return
            provenance_changed = values.provenance != chat.settings.provenance
            new_chat_changed = (values.thinking, values.system_prompt) != (chat.settings.thinking, chat.settings.system_prompt)
            if values.speculation and not chat.has_head:
                values.speculation = False
            if values.budget != chat.settings.budget:
                values.budget_auto = False
            before = chat.generation_params()
            chat.settings = values
            after = chat.generation_params()
            if provenance_changed:
                self.view.apply_provenance()
            notes = []
            if chat.chat_job is not None and (before.sampling, before.max_new_tokens) != (after.sampling, after.max_new_tokens):
                notes.append("sampling and length: from the next answer")
            if new_chat_changed:
                notes.append("thinking and system prompt: new chats")
            self.changed("settings applied" + (f" ({'; '.join(notes)})" if notes else ""))

        self.app.push_screen(SpecSettingsScreen(chat.settings, chat.algos, chat.max_depth), done)
