"""The jetspec-chat Textual app: setup, the main screen's chrome, sending, tree navigation.

Threading: `EngineWorker` owns the engine and the session (in the engine process, or on a
thread for the fake) and pushes everything into `self.outbox`; `_drain` (app_outbox.py, a ~12 Hz
timer on the UI thread) takes what is there, routes each item to its handler, and, as often as
the frame budget allows (frames.py), appends the batched text to the streaming Markdown and
redraws the tree, stats and status once. Nothing on the UI thread waits for the engine.
"""
from __future__ import annotations

import copy
import queue
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, ProgressBar, Static

from jetspec_chat.engine.events import PrefillEvent
from jetspec_chat.engine.params import GenerationParams, SamplingParams, SpecParams
from jetspec_chat.settings import (
    SessionStore,
    Settings,
    error_log_path,
    load_history,
    load_settings,
    save_history,
    save_settings,
    user_themes_dir,
)

from . import engine_worker as ew
from .engine_process import EngineProcess
from .frames import FrameBudget
from .app_commands import BINDINGS as APP_BINDINGS
from .app_commands import CommandsMixin
from .app_compare import CompareMixin
from .app_outbox import OutboxMixin
from .app_sessions import SessionsMixin
from .app_spec import LiveSpecMixin
from .chat import (
    AssistantMessage,
    ChatInput,
    ChatLog,
    NoteMessage,
    UserMessage,
    last_code_block,
)
from .compare import CompareScreen, CompareState
from .jobs import Job
from .liveness import can_update
from .stats import StatsPanel
from .styles import APP_CSS
from .themes import (
    DEFAULT_THEME,
    THEME_VARIABLE_DEFAULTS,
    SpecColors,
    builtin_themes,
    resolve_theme_name,
    user_themes,
)
from .trace import AnswerTrace, ArBaselines, compute_stats, params_label, prefill_line
from .tree_view import TreePanel

DRAIN_HZ = 12
KEEP_ROUNDS_OF_LAST = 20  # answers whose per-round trees stay in memory (for stepping and export)


def context_label(used: int, limit: int) -> str:
    """The status bar's context counter; the engine's count can run one past the window when
    it fills (the token that did not fit), so it is clamped and says full."""
    if used >= limit:
        return f"context full ({limit:,} / {limit:,} tokens)"
    return f"context {used:,} / {limit:,} tokens"


class LoadingPanel(Vertical):
    """The loading phase now under way, with the seconds it has taken so far (phases without a
    fraction, like reading a tokenizer, would otherwise look stalled) and a bar when there is one."""

    _title = ""
    _message = ""
    _started = 0.0
    _fraction: float | None = None

    def compose(self) -> ComposeResult:
        yield Static("Starting…", id="loading-label")
        yield ProgressBar(total=None, show_eta=False, id="loading-bar")

    def on_mount(self) -> None:
        self.set_interval(1.0, self._draw_label)
        self._draw()

    def set_progress(self, title: str, message: str, fraction: float | None) -> None:
        """Safe before compose: the latest progress is kept and drawn once the panel is mounted."""
        if message != self._message:
            self._started = time.monotonic()
        self._title, self._message, self._fraction = title, message, fraction
        if can_update(self):
            self._draw()

    def _draw(self) -> None:
        self._draw_label()
        fraction = self._fraction
        bar = self.query_one(ProgressBar)
        if fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=100, progress=max(0.0, min(100.0, fraction * 100)))

    def _draw_label(self) -> None:
        if not self.display or not self._title or not can_update(self):
            return
        elapsed = f" · {time.monotonic() - self._started:.0f} s"
        self.query_one("#loading-label", Static).update(Text.assemble((self._title, "bold"), "\n",
                                                                      self._message, (elapsed, "dim")))


class MainScreen(Screen):
    def compose(self) -> ComposeResult:
        yield Static("", id="topbar")
        with Horizontal(id="main"):
            with Vertical(id="chat-pane"):
                yield LoadingPanel(id="loading")
                yield ChatLog(id="chat")
                yield ChatInput(
                    input_history=self.app.history,  # type: ignore[attr-defined]
                    id="input",
                    placeholder="Message (Enter send · shift+Enter/ctrl+J newline · ↑ history · F1 help)",
                )
                yield Static("", id="status")
            with Vertical(id="side-pane"):
                yield TreePanel(id="tree")
                yield StatsPanel(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        self.app.main_screen_mounted()  # type: ignore[attr-defined]


class JetspecApp(OutboxMixin, CompareMixin, LiveSpecMixin, SessionsMixin, CommandsMixin, App):
    """The chat app. Its concerns live in mixins, one module each: `app_outbox` (engine reports
    in), `app_compare` (the compare screen's runs), `app_spec` (live speculation controls),
    `app_sessions` (new/save/open/autosave/export), `app_commands` (keys and palette). This
    module keeps setup, the main screen's chrome and sending."""

    CSS = APP_CSS
    TITLE = "jetspec-chat"
    BINDINGS = APP_BINDINGS

    def __init__(
        self,
        *,
        model: str | None = None,
        draft_head: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        max_context: int | None = None,
        tp: int = 1,
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
        (the default for a given backend such as the fake)."""
        super().__init__()
        self.spec = ew.EngineSpec(model, draft_head, device, dtype, max_context, tp)
        self.settings = settings if settings is not None else load_settings()
        self.persist_settings = persist_settings
        self.demo = demo  # --demo: the header says the engine and its numbers are scripted
        self.race_after_compare = race  # --race: each finished comparison opens its race
        self.requested_theme = theme
        self.requested_session = session
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.backend = backend
        self.engine_process = backend is None if engine_process is None else engine_process
        self.worker: ew.EngineWorker | EngineProcess = self._new_worker()
        self.engine_stopped: str | None = None  # why the engine process ended, until restarted
        self.store = SessionStore()
        self.history = load_history()
        # engine / load state
        self.engine_info: ew.EngineInfo | None = None
        self.load_state = "loading"  # loading | ready | failed
        self.load_error = ""
        self.load_retryable = True  # whether loading again can help (not for a missing package)
        self.load_progress: ew.LoadProgress | None = None
        # jobs and traces
        self.jobs: dict[int, Job] = {}
        self.chat_job: int | None = None
        self.aux_job: int | None = None
        self.traces: list[AnswerTrace] = []  # this chat's answers (and runs), for the trace export
        self.current_trace: AnswerTrace | None = None
        self.compare: CompareState | None = None
        self.compare_screen: CompareScreen | None = None
        self._compare_params: dict[str, GenerationParams] = {}
        self._compare_trace: AnswerTrace | None = None
        self.baselines = ArBaselines()  # AR measured per prompt key: speedups compare like with like
        self.stopping = False
        # session mirror (copied from the engine thread)
        self.session_data: dict | None = None
        self.session_messages: tuple[dict, ...] = ()
        self.context_tokens = 0
        self.session_name: str | None = None
        self.last_prefill: PrefillEvent | None = None
        self._pending: dict[AssistantMessage, str] = {}
        self._draining = False
        self.frames = FrameBudget()  # how often the drain may redraw (frames.py)
        self._dirty: set[str] = set()
        self._tree_position: int | None = None
        self._startup_notes: list[tuple[str, str]] = []
        self.main_screen: MainScreen | None = None
        self.cycle_themes: list[str] = []
        self.last_export: tuple[Path, Path | None] | None = None  # (screenshot, round trace if any)

    # ------------------------------------------------------------------ setup

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(THEME_VARIABLE_DEFAULTS)

    def get_default_screen(self) -> Screen:
        self.main_screen = MainScreen(id="main-screen")
        return self.main_screen

    def on_mount(self) -> None:
        ours = builtin_themes()
        extra, warnings = user_themes(user_themes_dir())
        for theme in ours + extra:
            self.register_theme(theme)
        self.cycle_themes = list(dict.fromkeys([t.name for t in ours] + [t.name for t in extra]))
        self._startup_notes += [(w, "warning") for w in warnings]
        wanted = self.requested_theme or self.settings.theme
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
        self.worker.start()
        self.worker.submit(self._load_command())
        self.set_interval(1.0 / DRAIN_HZ, self._drain, name="engine-drain")

    def main_screen_mounted(self) -> None:
        """The main screen's widgets exist: finish setting up."""
        self._q("#chat", ChatLog).set_class(self.settings.provenance, "-provenance")
        self.tree_panel.replay_speed = self.settings.replay_speed
        self.tree_panel.show_scores = self.settings.show_scores
        for text, kind in self._startup_notes:
            self.add_note(text, kind)
        self._startup_notes.clear()
        if self.requested_session:
            self._open_requested_session(self.requested_session)
        self._show_loading()
        self.refresh_chrome()
        self._q("#input", ChatInput).focus()

    def on_unmount(self) -> None:
        self.worker.shutdown(timeout=0.2)

    def theme_names(self) -> list[str]:
        """Ours and the user's first, then Textual's own."""
        ours = list(self.cycle_themes)
        return ours + sorted(n for n in self.available_themes if n not in ours and n != "textual-ansi")

    def _load_command(self) -> ew.LoadCommand:
        """Load the model and warm the budgets the first answers and the compare screen use."""
        s = self.settings
        compare = None if s.compare_budgets is None else tuple(int(b) for b in s.compare_budgets if b.isdigit())
        return ew.LoadCommand(self.spec, s.system_prompt, s.thinking, None if s.budget_auto else s.budget, compare)

    def _new_worker(self) -> ew.EngineWorker | EngineProcess:
        if self.engine_process:
            return EngineProcess(self.backend, self.outbox)
        return ew.EngineWorker(self.backend, self.outbox)

    # ------------------------------------------------------------------ handy getters

    @property
    def tree_panel(self) -> TreePanel:
        return self.main_screen.query_one(TreePanel)

    def _main_ready(self) -> bool:
        return can_update(self.main_screen)

    def _q(self, selector: str, kind: type | None = None):
        return self.main_screen.query_one(selector, kind) if kind else self.main_screen.query_one(selector)

    @property
    def busy(self) -> bool:
        return self.chat_job is not None or self.aux_job is not None or bool(self.compare and self.compare.running)

    @property
    def algos(self) -> tuple[str, ...]:
        return self.engine_info.tree_algos if self.engine_info else ew.tree_algos(self.worker.backend)

    @property
    def has_head(self) -> bool:
        return self.engine_info is None or self.engine_info.max_depth is not None

    def generation_params(self, **spec_changes: Any) -> GenerationParams:
        s = self.settings
        max_depth = self.engine_info.max_depth if self.engine_info else None
        depth = s.depth
        if depth is not None and max_depth is not None and depth >= max_depth:
            depth = None
        spec = SpecParams(
            budget=s.budget,
            depth=depth,
            width=s.width,
            tree_algo=s.tree_algo,
            enabled=s.speculation and self.has_head,
        )
        if spec_changes:
            spec = replace(spec, **spec_changes)
        seed = s.seed if s.seed is not None else (0 if s.temperature > 0 else None)
        return GenerationParams(
            max_new_tokens=s.max_new_tokens,
            spec=spec,
            sampling=SamplingParams(temperature=s.temperature, top_p=s.top_p, seed=seed),
        )

    def last_answer_trace(self) -> AnswerTrace | None:
        """The trace of the answer now last in the chat (a chat turn or a kept rerun)."""
        for trace in reversed(self.traces):
            if trace.kind in ("chat", "rerun") and trace.result is not None:
                return trace
        return None

    def last_user_text(self) -> str | None:
        for m in reversed(self.session_messages):
            if m.get("role") == "user":
                return str(m.get("content", ""))
        return None

    @property
    def turn(self) -> int:
        return sum(1 for m in self.session_messages if m.get("role") == "user")

    # ------------------------------------------------------------------ notes, chrome

    async def add_note_async(self, text: str, kind: str = "info") -> None:
        chat = self._q("#chat", ChatLog)
        await chat.mount(NoteMessage(text, kind))

    def add_note(self, text: str, kind: str = "info") -> None:
        chat = self._q("#chat", ChatLog)
        chat.mount(NoteMessage(text, kind))

    def save_settings(self) -> None:
        if not self.persist_settings:
            return
        try:
            save_settings(self.settings)
        except OSError as err:
            self.notify(f"could not save settings: {err}", severity="warning")

    def refresh_chrome(self) -> None:
        """Top bar and status line."""
        if not self._main_ready():
            return
        colors = SpecColors.from_app(self)
        top = Text(no_wrap=True, overflow="ellipsis")
        top.append("jetspec-chat", style="bold")
        info = self.engine_info
        if info is not None:
            top.append(f"  {info.model_name}", style="bold")
            top.append(f" + {info.head_name}" if info.head_name else "  (no draft head)", style=colors.muted)
            if self.demo:
                top.append("  DEMO: a scripted engine, its numbers are made up", style=f"bold {colors.bonus}")
            else:
                top.append(f"  {info.device} {info.dtype}", style=colors.muted)
        elif self.load_state == "loading":
            top.append(f"  loading {self.spec.model or 'the default model'}…", style=colors.muted)
        else:
            top.append("  no model loaded", style="bold red")
        top.append("  │  ", style=colors.muted)
        p = self.generation_params().spec
        if p.enabled:
            depth = "full" if p.depth is None else str(p.depth)
            # Until the engine reports its device, an automatic budget is not known yet.
            budget = "auto" if self.settings.budget_auto and info is None else str(p.budget)
            top.append(f"budget {budget}", style=f"bold {colors.accepted}")
            top.append(f" · depth {depth} · width {p.width} · {p.tree_algo}")
        elif info is not None and info.max_depth is None:
            top.append("no draft head: speculation off (plain AR)", style=f"bold {colors.bonus}")
        else:
            top.append("speculation OFF (plain AR)", style=f"bold {colors.bonus}")
        if self.settings.temperature > 0:
            top.append(f" · T={self.settings.temperature:g}")
        if self.session_name:
            top.append(f"  │  session {self.session_name}", style=colors.muted)
        self._q("#topbar", Static).update(top)
        self._q("#status", Static).update(self._status_text(colors))

    def _status_text(self, colors: SpecColors) -> Text:
        t = Text(no_wrap=True, overflow="ellipsis")
        if self.load_state == "loading":
            pct = ""
            if self.load_progress and self.load_progress.fraction is not None:
                pct = f" {self.load_progress.fraction * 100:.0f}%"
            msg = self.load_progress.message if self.load_progress else "starting"
            t.append(f"loading{pct}: {msg}", style=f"bold {colors.bonus}")
        elif self.load_state == "failed":
            t.append("no model loaded", style="bold red")
        elif self.stopping and self.busy:
            t.append("stopping at the next round boundary…", style=f"bold {colors.bonus}")
        elif self.chat_job is not None:
            trace = self.jobs[self.chat_job].trace if self.chat_job in self.jobs else None
            n = len(trace.rounds) if trace else 0
            t.append(f"generating · round {n}" if trace and trace.prefill else "prefilling…", style=f"bold {colors.accepted}")
            t.append("  (Esc stops)", style=colors.muted)
        elif self.aux_job is not None:
            trace = self.jobs[self.aux_job].trace if self.aux_job in self.jobs else None
            t.append(f"measuring plain AR · round {len(trace.rounds) if trace else 0}", style=f"bold {colors.bonus}")
            t.append("  (Esc stops)", style=colors.muted)
        elif self.compare and self.compare.running:
            t.append("comparing budgets… (F6 shows it)", style=f"bold {colors.bonus}")
        else:
            t.append("ready", style=f"bold {colors.accepted}")
        if self.engine_info is not None:
            context = self.context_tokens
            live = self.jobs.get(self.chat_job) if self.chat_job is not None else None
            if live is not None and live.trace is not None and live.trace.rounds:
                context = live.trace.rounds[-1].context_tokens  # while streaming: the engine's count
            full = context >= self.engine_info.max_context
            t.append(f"  ·  {context_label(context, self.engine_info.max_context)}",
                     style=f"bold {colors.bonus}" if full else colors.muted)
        if self.last_prefill is not None:
            t.append(f"  ·  {prefill_line(self.last_prefill)}", style=colors.muted)
        return t

    def _apply_theme_classes(self) -> None:
        colors = SpecColors.from_app(self)
        self.set_class(colors.projector, "-projector")

    def _on_theme_changed(self, theme: Any) -> None:
        self._apply_theme_classes()
        if theme.name != self.settings.theme:
            self.settings.theme = theme.name
            self.save_settings()
        self.refresh_chrome()
        self._refresh_provenance_all()
        if can_update(self.compare_screen):
            self.compare_screen.refresh_state()

    def on_resize(self, event) -> None:
        self._apply_size_classes(event.size)

    def _apply_size_classes(self, size=None) -> None:
        w, h = size if size is not None else self.size
        self.set_class(w < 100, "-narrow")
        self.set_class(w < 60 or h < 16, "-tiny")

    def _show_loading(self) -> None:
        panel = self._q("#loading", LoadingPanel)
        if self.load_state != "loading":
            panel.display = False
            return
        panel.display = True
        p = self.load_progress
        title = f"Loading {self.spec.model or 'the default model'}"
        panel.set_progress(title, p.message if p else "starting", p.fraction if p else None)

    @property
    def baseline(self):
        """The AR measurement of the answer on screen's own prompt, if any (None otherwise)."""
        return self.baselines.for_trace(self.current_trace)

    def _update_stats(self) -> None:
        trace = self.current_trace
        pos = self._tree_position
        stats = compute_stats(trace, self.baselines.for_trace(trace), upto=None if pos is None else pos + 1)
        self._q("#stats", StatsPanel).show(stats, replay_round=pos)

    # ------------------------------------------------------------------ sending

    @on(ChatInput.Submitted)
    async def _submitted(self, event: ChatInput.Submitted) -> None:
        await self.send_message(event.text)

    async def send_message(self, text: str) -> bool:
        if not text.strip():
            return False
        if self.engine_stopped is not None:
            await self.add_note_async(
                "The engine is not running: press ctrl+e to restart it (your message stays in the box).", "error"
            )
            return False
        if self.load_state == "failed":
            retry = " Retry from the command palette (ctrl+p: Retry loading)." if self.load_retryable else ""
            await self.add_note_async(f"No model is loaded ({self.load_error}).{retry}", "error")
            return False
        if self.busy:
            self.notify("Wait for the current run to finish, or press Esc to stop it.", severity="warning")
            return False
        chat_input = self._q("#input", ChatInput)
        chat_input.remember(text)
        chat_input.text = ""
        self.history = chat_input.input_history
        try:
            save_history(self.history)
        except OSError:
            pass
        params = self.generation_params()
        label = "jetspec · " + params_label(params)
        trace = AnswerTrace(job_id=0, kind="chat", params=params, user_text=text)
        msg = AssistantMessage(label, thinking_enabled=self._session_thinking(), streaming=True)
        msg.trace = trace
        chat = self._q("#chat", ChatLog)
        await chat.mount_all([UserMessage(text), msg])
        chat.follow()
        job_id = self.worker.submit(ew.SendCommand(text, params))
        trace.job_id = job_id
        self.jobs[job_id] = Job("chat", trace, msg, turn=self.turn + 1)
        self.chat_job = job_id
        self.traces.append(trace)
        self._prune_traces()
        self.current_trace = trace
        self._tree_position = None
        self.tree_panel.show_trace(trace)
        self._update_stats()
        self.refresh_chrome()
        return True

    def _prune_traces(self) -> None:
        """Drop the per-round trees of old answers (their text and results stay)."""
        for trace in self.traces[:-KEEP_ROUNDS_OF_LAST]:
            if trace.rounds:
                trace.rounds = []
                trace.round_offsets = []

    def _session_thinking(self) -> bool:
        if self.session_data is not None:
            return bool(self.session_data.get("thinking", self.settings.thinking))
        return self.settings.thinking

    # ------------------------------------------------------------------ actions: generation

    def action_stop(self) -> None:
        cancelled = False
        for job_id in (self.chat_job, self.aux_job):
            if job_id is not None:
                self.worker.cancel(job_id)
                cancelled = True
        if self.compare and self.compare.running and self.compare.job_id is not None:
            self.worker.cancel(self.compare.job_id)
            cancelled = True
        if cancelled:
            self.stopping = True
            self.refresh_chrome()

    def action_measure_ar(self) -> None:
        if not self._ready_for_rerun("measure plain AR"):
            return
        params = self.generation_params(enabled=False)
        job_id = self.worker.submit(ew.RerunCommand(params, "ar"))
        trace = AnswerTrace(job_id=job_id, kind="rerun", params=params, user_text=self.last_user_text() or "")
        self.jobs[job_id] = Job("rerun", trace, None, turn=self.turn, pre_session=copy.deepcopy(self.session_data))
        self.traces.append(trace)
        self.aux_job = job_id
        self.notify("Measuring plain AR speed on the last prompt…")
        self.refresh_chrome()

    def _ready_for_rerun(self, what: str) -> bool:
        if self.load_state != "ready":
            self.notify(f"Cannot {what}: the model is not loaded.", severity="warning")
            return False
        if self.busy:
            self.notify(f"Cannot {what} while a run is going (Esc stops it).", severity="warning")
            return False
        if self.last_user_text() is None:
            self.notify(f"Send a message first: {what} reruns the last prompt.", severity="warning")
            return False
        return True

    # -- tree navigation

    def action_tree_pause(self) -> None:
        self.tree_panel.action_toggle_pause()

    def action_tree_step(self, delta: int) -> None:
        self.tree_panel.action_step(delta)

    def action_replay(self) -> None:
        if self.current_trace is None or not self.current_trace.rounds:
            self.notify("No answer to replay yet.", severity="warning")
            return
        self.tree_panel.action_replay()

    def set_replay_speed(self, speed: float) -> None:
        self.settings.replay_speed = speed
        self.tree_panel.replay_speed = speed
        self.save_settings()

    @on(TreePanel.PositionChanged)
    def _tree_position_changed(self, event: TreePanel.PositionChanged) -> None:
        self._tree_position = event.position
        self._update_stats()

    # -- provenance, copy, export

    def action_toggle_provenance(self) -> None:
        self.settings.provenance = not self.settings.provenance
        self.save_settings()
        self._apply_provenance()
        self.notify("answer colored by provenance" if self.settings.provenance else "provenance colors off", timeout=2)

    def _apply_provenance(self) -> None:
        self._q("#chat", ChatLog).set_class(self.settings.provenance, "-provenance")
        self._refresh_provenance_all()

    def _refresh_provenance_all(self) -> None:
        if not self.settings.provenance or not self._main_ready():
            return
        colors = SpecColors.from_app(self)
        for msg in self._q("#chat", ChatLog).query(AssistantMessage):
            trace = msg.trace
            msg.show_provenance(trace.segments if trace is not None else msg.segments, colors)

    def _assistant_messages(self) -> list[AssistantMessage]:
        return list(self._q("#chat", ChatLog).query(AssistantMessage))

    def action_copy_answer(self) -> None:
        for msg in reversed(self._assistant_messages()):
            text = msg.answer_text
            if text.strip():
                self.copy_to_clipboard(text)
                self.notify(f"Copied the last answer ({len(text):,} characters).", timeout=2)
                return
        self.notify("No answer to copy yet.", severity="warning")

    def action_copy_code(self) -> None:
        for msg in reversed(self._assistant_messages()):
            code = last_code_block(msg.answer_text)
            if code is not None:
                self.copy_to_clipboard(code)
                self.notify(f"Copied the last code block ({len(code.splitlines())} lines).", timeout=2)
                return
        self.notify("No code block in the answers yet.", severity="warning")

    # ------------------------------------------------------------------ errors

    def _log_error(self, what: str, details: str) -> None:
        try:
            path = error_log_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n{details}\n")
        except OSError:
            pass
