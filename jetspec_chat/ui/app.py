"""The jetspec-chat Textual app: the composition root.

`JetspecApp` builds the collaborators, each owning its state, and routes keys and palette
commands to them:
- `ChatController` (controller.py): the engine connection (worker, outbox), loading, jobs and
  traces, the session mirror, the comparison's state and the settings;
- `ChatView` (chat_view.py): what the main screen shows of it (main_screen.py lays it out);
- `EngineReports` (engine_reports.py): the engine's reports applied to both;
- `SessionActions` (session_actions.py), `SpeculationControls` (speculation_controls.py),
  `CompareRuns` (compare/runs.py): what the keys and the palette do.

Threading: `EngineWorker` owns the engine and the session (in the engine process, or on a
thread for the fake) and pushes everything into the controller's outbox; `EngineReports.drain`
(a ~12 Hz timer on the UI thread) takes what is there, routes each item to its handler, and, as
often as the frame budget allows (frames.py), appends the batched text to the streaming Markdown
and redraws the tree, stats and status once. Nothing on the UI thread waits for the engine.
"""
from __future__ import annotations

import time
from typing import Any, Iterable

from textual import on
from textual.app import App, SystemCommand
from textual.command import CommandPalette
from textual.screen import Screen

from jetspec_chat.settings import Settings, error_log_path, load_history, load_settings, save_history, user_themes_dir

from . import engine_worker as ew
from .chat import AssistantMessage, ChatInput, UserMessage
from .chat_view import ChatView
from .commands import BINDINGS, COMPARE_SCREEN_ACTIONS, MAIN_ONLY_ACTIONS, Palette
from .compare import CompareRuns, CompareScreen
from .controller import ChatController
from .dialogs import BUDGET_STEPS, HelpScreen
from .engine_reports import EngineReports
from .liveness import can_update, dismiss_if_current
from .main_screen import MainScreen
from .session_actions import SessionActions
from .speculation_controls import SpeculationControls
from .styles import APP_CSS
from .themes import DEFAULT_THEME, THEME_VARIABLE_DEFAULTS, SpecColors, builtin_themes, resolve_theme_name, user_themes
from .trace import params_label
from .tree_view import TreePanel

DRAIN_HZ = 12


class JetspecApp(App):
    """The chat app: builds its collaborators (see the module's docstring) and routes keys,
    palette commands and widget messages to them."""

    CSS = APP_CSS
    TITLE = "jetspec-chat"
    BINDINGS = BINDINGS

    def __init__(
        self,
        *,
        model: str | None = None,
        draft_head: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        max_context: int | None = None,
        tp: int | None = None,
        backend: ew.Backend | None = None,
        settings: Settings | None = None,
        theme: str | None = None,
        session: str | None = None,
        persist_settings: bool = True,
        engine_process: bool | None = None,
        demo: bool = False,
        race: bool = False,
    ) -> None:
        """`backend`: an object with `load_engine`, `ChatSession` (and optionally `TREE_ALGOS`),
        e.g. `jetspec_chat.engine` (the default, imported on the engine thread) or
        `jetspec_chat.ui.fake_engine.FakeBackend()`. `engine_process`: run the engine in a spawned
        child process (the default for the real engine) rather than on a thread of this one
        (the default for a given backend such as the fake). `demo`: the header says the engine
        and its numbers are scripted. `race`: each finished comparison opens its race."""
        super().__init__()
        self.chat = ChatController(
            engine_setup=ew.EngineSetup(model, draft_head, device, dtype, max_context, tp),
            settings=settings if settings is not None else load_settings(),
            backend=backend,
            engine_process=backend is None if engine_process is None else engine_process,
            persist_settings=persist_settings,
        )
        self.requested_theme = theme
        self.requested_session = session
        self.history = load_history()
        self.main_screen = MainScreen(self.history, self._main_screen_mounted)
        self.view = ChatView(self, self.chat, self.main_screen, demo=demo)
        self.sessions = SessionActions(self, self.chat, self.view)
        self.speculation = SpeculationControls(self, self.chat, self.view)
        self.compare_runs = CompareRuns(self.chat)
        self.reports = EngineReports(self.chat, self.view, self.compare_runs, self.sessions,
                                     log_error=self.log_error, race_after_compare=race)
        self.cycle_themes: list[str] = []
        self._startup_notes: list[tuple[str, str]] = []

    # ------------------------------------------------------------------ setup

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(THEME_VARIABLE_DEFAULTS)

    def get_default_screen(self) -> Screen:
        return self.main_screen

    def on_mount(self) -> None:
        ours = builtin_themes()
        extra, warnings = user_themes(user_themes_dir())
        for theme in ours + extra:
            self.register_theme(theme)
        self.cycle_themes = list(dict.fromkeys([t.name for t in ours] + [t.name for t in extra]))
        self._startup_notes += [(w, "warning") for w in warnings]
        settings = self.chat.settings
        wanted = self.requested_theme or settings.theme
        name = resolve_theme_name(wanted, self.available_themes)
        if name is None:
            if self.requested_theme:
                known = ", ".join(self.theme_names())
                self._startup_notes.append((f"unknown theme {wanted!r}; available: {known}", "warning"))
            name = DEFAULT_THEME
        self.theme = name
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self._apply_theme_classes()
        self._apply_size_classes()
        self.chat.worker.start()
        self.chat.worker.submit(self.chat.load_command())
        self.set_interval(1.0 / DRAIN_HZ, self.reports.drain, name="engine-drain")

    def _main_screen_mounted(self) -> None:
        """The main screen's widgets exist: finish setting up."""
        view, settings = self.view, self.chat.settings
        view.chat_log.set_class(settings.provenance, "-provenance")
        view.tree_panel.replay_speed = settings.replay_speed
        view.tree_panel.show_scores = settings.show_scores
        for text, kind in self._startup_notes:
            view.add_note(text, kind)
        self._startup_notes.clear()
        if self.requested_session:
            self.sessions.open_requested(self.requested_session)
        view.show_loading()
        view.refresh_chrome()
        view.chat_input.focus()

    def on_unmount(self) -> None:
        self.chat.worker.shutdown(timeout=0.2)

    async def drain_now(self) -> None:
        """Process and draw everything the engine has reported so far (tests use it too)."""
        await self.reports.drain(force=True)

    def theme_names(self) -> list[str]:
        """Ours and the user's first, then Textual's own."""
        ours = list(self.cycle_themes)
        return ours + sorted(n for n in self.available_themes if n not in ours and n != "textual-ansi")

    def _apply_theme_classes(self) -> None:
        self.set_class(SpecColors.from_app(self).projector, "-projector")

    def _on_theme_changed(self, theme: Any) -> None:
        self._apply_theme_classes()
        if theme.name != self.chat.settings.theme:
            self.chat.settings.theme = theme.name
            self.view.save_settings()
        self.view.refresh_chrome()
        self.view.refresh_provenance_all()
        if can_update(self.view.compare_screen):
            self.view.compare_screen.refresh_state()

    def on_resize(self, event) -> None:
        self._apply_size_classes(event.size)

    def _apply_size_classes(self, size=None) -> None:
        w, h = size if size is not None else self.size
        self.set_class(w < 100, "-narrow")
        self.set_class(w < 60 or h < 16, "-tiny")

    def on_screen_resume(self) -> None:
        self.view.refresh_chrome()

    def log_error(self, what: str, details: str) -> None:
        try:
            path = error_log_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n{details}\n")
        except OSError:
            pass

    # ------------------------------------------------------------------ sending

    @on(ChatInput.Submitted)
    async def _submitted(self, event: ChatInput.Submitted) -> None:
        await self.send_message(event.text)

    async def send_message(self, text: str) -> bool:
        chat, view = self.chat, self.view
        if not text.strip():
            return False
        if (why := chat.cannot_send()) is not None:
            await view.add_note_async(why, "error")
            return False
        if chat.busy:
            self.notify("Wait for the current run to finish, or press Esc to stop it.", severity="warning")
            return False
        chat_input = view.chat_input
        chat_input.remember(text)
        chat_input.text = ""
        self.history = chat_input.input_history
        try:
            save_history(self.history)
        except OSError:
            pass
        params = chat.generation_params()
        msg = AssistantMessage("jetspec · " + params_label(params), thinking_enabled=chat.session_thinking(),
                               streaming=True)
        await view.chat_log.mount_all([UserMessage(text), msg])
        view.chat_log.follow()
        msg.trace = chat.send(text, params, msg)
        view.show_trace(msg.trace)
        view.refresh_chrome()
        return True

    # ------------------------------------------------------------------ keys

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in MAIN_ONLY_ACTIONS and self.screen is not self.main_screen:
            if not (action in COMPARE_SCREEN_ACTIONS and self.screen is self.view.compare_screen):
                return False
        if action == "stop":
            return True if self.chat.busy else None
        if action == "restart_engine":
            return self.chat.engine_stopped is not None or self.chat.load_state == "failed"
        return True

    def action_command_palette(self) -> None:
        if self.use_command_palette and not CommandPalette.is_open(self):
            self.push_screen(Palette(id="--command-palette"))

    def action_stop(self) -> None:
        if self.chat.stop():
            self.view.refresh_chrome()

    def action_measure_ar(self) -> None:
        if (why := self.chat.cannot_rerun("measure plain AR")) is not None:
            self.notify(why, severity="warning")
            return
        self.chat.measure_ar()
        self.notify("Measuring plain AR speed on the last prompt…")
        self.view.refresh_chrome()

    def action_retry_load(self) -> None:
        chat = self.chat
        if chat.load_state != "failed" or not chat.load_retryable:
            return
        if chat.engine_stopped is not None or not chat.worker.alive:
            self.action_restart_engine()
            return
        chat.start_loading()
        self.view.show_loading()
        self.view.refresh_chrome()

    def action_restart_engine(self) -> None:
        """A new engine (process): load the model again and put the conversation back."""
        chat = self.chat
        if chat.engine_stopped is None and chat.worker.alive and chat.load_state != "failed":
            self.notify("The engine is running.", timeout=2)
            return
        chat.restart_engine()
        self.view.add_note("Restarting the engine; the conversation continues where it was.", "info")
        self.view.show_loading()
        self.view.refresh_chrome()

    def action_compare(self) -> None:
        view = self.view
        if can_update(view.compare_screen):  # open: F6 closes it
            dismiss_if_current(view.compare_screen)
            return
        if self.chat.compare is None or not self.chat.compare.running:
            if (why := self.chat.cannot_rerun("compare budgets")) is not None:
                self.notify(why, severity="warning")
                return
            self.chat.compare = self.compare_runs.new_state()
        labels = ", ".join(self.compare_runs.budget_labels())
        view.compare_screen = CompareScreen(self.chat.compare, labels, self.compare_runs.estimate_seconds)
        self.push_screen(view.compare_screen)

    @on(CompareScreen.RunRequested)
    def _compare_run_requested(self, event: CompareScreen.RunRequested) -> None:
        if self.chat.busy:
            self.notify("Wait for the current run to finish, or press Esc to stop it.", severity="warning")
            return
        state = self.compare_runs.start(event.labels)
        self.view.save_settings()
        if self.view.compare_screen is not None:
            self.view.compare_screen.set_state(state)
        self.view.refresh_chrome()

    @on(CompareScreen.CancelRequested)
    def _compare_cancel_requested(self) -> None:
        self.compare_runs.cancel()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_next_theme(self) -> None:
        names = self.cycle_themes or self.theme_names()
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        self.notify(f"theme {self.theme}", timeout=2)

    def action_budget(self, direction: int) -> None:
        self.speculation.step_budget(direction)

    def action_next_algo(self) -> None:
        self.speculation.next_algo()

    def action_toggle_spec(self) -> None:
        self.speculation.toggle_speculation()

    def action_spec_settings(self) -> None:
        self.speculation.open_dialog()

    def action_toggle_provenance(self) -> None:
        self.speculation.toggle_provenance()

    def action_tree_pause(self) -> None:
        self.view.tree_panel.action_toggle_pause()

    def action_tree_step(self, delta: int) -> None:
        self.view.tree_panel.action_step(delta)

    def action_replay(self) -> None:
        trace = self.chat.current_trace
        if trace is None or not trace.rounds:
            self.notify("No answer to replay yet.", severity="warning")
            return
        self.view.tree_panel.action_replay()

    @on(TreePanel.PositionChanged)
    def _tree_position_changed(self, event: TreePanel.PositionChanged) -> None:
        self.view.tree_position = event.position
        self.view.update_stats()

    def action_copy_answer(self) -> None:
        self.view.copy_answer()

    def action_copy_code(self) -> None:
        self.view.copy_code()

    def action_new_chat(self) -> None:
        self.sessions.new_chat()

    def action_save_session(self) -> None:
        self.sessions.ask_save()

    def action_open_session(self) -> None:
        self.sessions.ask_open()

    def action_export(self) -> None:
        self.sessions.export()

    # ------------------------------------------------------------------ command palette

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        c, chat, controls = SystemCommand, self.chat, self.speculation
        cur = chat.settings

        def mark(is_current: bool) -> str:
            return " (current)" if is_current else ""

        yield c("Compare budgets", "Rerun the last prompt at several budgets and plain AR", self.action_compare)
        yield c("Measure plain AR speed", "Rerun the last prompt without speculation (for the speedup)", self.action_measure_ar)
        yield c("Speculation settings…", "Budget, depth, width, tree algorithm, temperature, …", self.action_spec_settings)
        yield c(
            f"Speculation: turn {'off' if cur.speculation else 'on'}",
            "Plain autoregressive decoding on the same engine" if cur.speculation else "Tree speculative decoding",
            self.action_toggle_spec,
        )
        for b in BUDGET_STEPS:
            yield c(f"Budget: {b}", f"Draft tree of at most {b} node{'s' if b > 1 else ''}{mark(b == cur.budget)}",
                    lambda b=b: controls.set_budget(b))
        yield c("Depth: full", f"Draft as deep as the head's block allows{mark(cur.depth is None)}",
                lambda: controls.set_depth(None))
        for d in range(1, (chat.max_depth or 16)):
            yield c(f"Depth: {d}", f"Draft at most {d} tokens ahead{mark(d == cur.depth)}", lambda d=d: controls.set_depth(d))
        for w in (1, 2, 4, 6, 8, 12, 16, 32):
            yield c(f"Width: {w}", f"Top-{w} candidates per depth{mark(w == cur.width)}", lambda w=w: controls.set_width(w))
        for a in chat.algos:
            yield c(f"Tree algorithm: {a}", f"How the draft tree is built{mark(a == cur.tree_algo)}",
                    lambda a=a: controls.set_algo(a))
        for t in (0.0, 0.6, 0.7, 1.0):
            yield c(f"Temperature: {t:g}" + (" (greedy)" if t == 0 else ""), "Sampling temperature for the next answers",
                    lambda t=t: controls.set_temperature(t))
        yield c("Pause / follow the live tree", "Stop the tree view on a round, or follow the latest", self.action_tree_pause)
        yield c("Previous round", "Step the tree view back one round", lambda: self.action_tree_step(-1))
        yield c("Next round", "Step the tree view forward one round", lambda: self.action_tree_step(1))
        yield c("Replay the answer", "Show the rounds of the answer one by one", self.action_replay)
        for s in (1, 2, 4, 8, 16):
            yield c(f"Replay speed: {s} rounds/s", "Speed of the round-by-round replay", lambda s=s: controls.set_replay_speed(s))
        yield c("Toggle provenance colors", "Color the answer: accepted draft tokens vs target tokens", self.action_toggle_provenance)
        yield c("Toggle tree scores", "Show the cumulative log-probabilities next to tree nodes", controls.toggle_scores)
        yield c("Copy the last answer", "To the clipboard", self.action_copy_answer)
        yield c("Copy the last code block", "To the clipboard", self.action_copy_code)
        yield c("New chat", "Start over and drop the KV cache", self.action_new_chat)
        yield c("Save session…", "Save this chat to the data directory", self.action_save_session)
        yield c("Open session…", "Reopen a saved chat", self.action_open_session)
        yield c(f"Thinking: turn {'off' if cur.thinking else 'on'} (new chats)", "Qwen3 thinking mode for the next new chat",
                controls.toggle_thinking)
        for name in self.cycle_themes:
            yield c(f"Theme: {name}", "Switch the color theme", lambda n=name: setattr(self, "theme", n))
        yield c("Export screen and round trace", "SVG of the screen and JSONL of every round", self.action_export)
        yield c("Help: keys", "All keys and what the tree shows", self.action_help)
        if chat.engine_stopped is not None:
            yield c("Restart the engine", "Start the engine again and continue this conversation", self.action_restart_engine)
        elif chat.load_state == "failed" and chat.load_retryable:
            yield c("Retry loading the model", "Try to load the model again", self.action_retry_load)
