"""The jetspec-chat Textual app.

Threading: `EngineWorker` owns the engine and the session on its own thread and pushes
everything into `self.outbox`; `_drain` (a ~12 Hz timer on the UI thread) takes what is there,
updates the per-answer traces, appends the batched text to the streaming Markdown and redraws
the tree, stats and status once. Nothing on the UI thread waits for the engine.
"""
from __future__ import annotations

import copy
import dataclasses
import queue
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, ProgressBar, Static

from jetspec_chat.engine.events import FinishEvent, PrefillEvent, RoundEvent
from jetspec_chat.engine.params import GenerationParams, SamplingParams, SpecParams
from jetspec_chat.settings import (
    SessionStore,
    SessionStoreError,
    Settings,
    atomic_write_text,
    error_log_path,
    exports_dir,
    load_history,
    load_settings,
    save_history,
    save_settings,
    suggest_session_name,
    user_themes_dir,
)

from . import engine_worker as ew
from .chat import (
    AssistantMessage,
    ChatInput,
    ChatLog,
    NoteMessage,
    UserMessage,
    last_code_block,
)
from .compare import AR_LABEL, CompareScreen, CompareState
from .dialogs import (
    BUDGET_STEPS,
    HelpScreen,
    OpenSessionScreen,
    SaveSessionScreen,
    SpecSettingsScreen,
    step_in,
)
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
from .trace import AnswerTrace, ArBaseline, compute_stats, params_label, prefill_line
from .tree_view import TreePanel

DRAIN_HZ = 12
NO_HEAD_NOTE = "no draft head: speculation off (plain AR); pass --draft-head to speculate"
KEEP_ROUNDS_OF_LAST = 20  # answers whose per-round trees stay in memory (for stepping and export)
_MAIN_ONLY_ACTIONS = {
    "stop", "help", "budget", "next_algo", "toggle_spec", "compare", "tree_pause", "tree_step", "replay",
    "spec_settings", "measure_ar", "new_chat", "save_session", "open_session", "copy_answer", "copy_code",
    "toggle_provenance", "next_theme", "export",
}
MAX_ITEMS_PER_DRAIN = 5000


@dataclass
class Job:
    kind: str  # "chat" | "rerun" | "compare" | "session"
    trace: AnswerTrace | None = None
    message: AssistantMessage | None = None
    turn: int = 0
    pre_session: dict | None = None  # reruns: the session before, to put back if the answer changed
    live_spec: SpecParams | None = None  # chat: the tree shape last asked of the engine


class LoadingPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static("Starting…", id="loading-label")
        yield ProgressBar(total=None, show_eta=False, id="loading-bar")

    def set_progress(self, title: str, message: str, fraction: float | None) -> None:
        self.query_one("#loading-label", Static).update(Text.assemble((title, "bold"), "\n", message))
        bar = self.query_one(ProgressBar)
        if fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=100, progress=max(0.0, min(100.0, fraction * 100)))


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


class JetspecApp(App):
    CSS = APP_CSS
    TITLE = "jetspec-chat"

    BINDINGS = [
        Binding("escape", "stop", "Stop", show=True),
        Binding("f1", "help", "Help"),
        Binding("f2", "budget(-1)", "Budget−"),
        Binding("f3", "budget(1)", "Budget+"),
        Binding("f4", "next_algo", "Algo", show=False),
        Binding("f5", "toggle_spec", "Spec on/off"),
        Binding("f6", "compare", "Compare", priority=True),  # priority: TextArea binds f6/f7
        Binding("f7", "tree_pause", "Pause", show=False, priority=True),
        Binding("f8", "tree_step(-1)", "◀ Round", show=False),
        Binding("f9", "tree_step(1)", "Round ▶", show=False),
        Binding("f10", "replay", "Replay", show=False),
        Binding("f12", "export", "Export", show=False),
        Binding("ctrl+b", "spec_settings", "Settings", show=False),
        Binding("ctrl+r", "measure_ar", "Measure AR", show=False),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+s", "save_session", "Save", show=False),
        Binding("ctrl+o", "open_session", "Open", show=False),
        Binding("ctrl+t", "next_theme", "Theme", show=False),
        Binding("ctrl+l", "copy_answer", "Copy answer", show=False),
        Binding("ctrl+g", "copy_code", "Copy code", show=False),
        Binding("ctrl+backslash", "toggle_provenance", "Provenance", show=False),
    ]

    def __init__(
        self,
        *,
        model: str | None = None,
        draft_head: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        max_context: int | None = None,
        backend: Any | None = None,
        settings: Settings | None = None,
        theme: str | None = None,
        session: str | None = None,
        persist_settings: bool = True,
    ) -> None:
        """`backend`: an object with `load_engine`, `ChatSession` (and optionally `TREE_ALGOS`),
        e.g. `jetspec_chat.engine` (the default, imported on the engine thread) or
        `jetspec_chat.ui.fake_engine.FakeBackend()`."""
        super().__init__()
        self.spec = ew.EngineSpec(model, draft_head, device, dtype, max_context)
        self.settings = settings if settings is not None else load_settings()
        self.persist_settings = persist_settings
        self.requested_theme = theme
        self.requested_session = session
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.worker = ew.EngineWorker(backend, self.outbox)
        self.store = SessionStore()
        self.history = load_history()
        # engine / load state
        self.engine_info: ew.EngineInfo | None = None
        self.load_state = "loading"  # loading | ready | failed
        self.load_error = ""
        self.load_progress: ew.LoadProgress | None = None
        # jobs and traces
        self.jobs: dict[int, Job] = {}
        self.chat_job: int | None = None
        self.aux_job: int | None = None
        self.traces: list[AnswerTrace] = []  # this chat's answers (and runs), for the trace export
        self.current_trace: AnswerTrace | None = None
        self.compare: CompareState | None = None
        self.compare_screen: CompareScreen | None = None
        self.baseline: ArBaseline | None = None
        self.stopping = False
        # session mirror (copied from the engine thread)
        self.session_data: dict | None = None
        self.session_messages: tuple[dict, ...] = ()
        self.context_tokens = 0
        self.session_name: str | None = None
        self.last_prefill: PrefillEvent | None = None
        self._pending: dict[AssistantMessage, str] = {}
        self._draining = False
        self._dirty: set[str] = set()
        self._tree_position: int | None = None
        self._startup_notes: list[tuple[str, str]] = []
        self.main_screen: MainScreen | None = None
        self.cycle_themes: list[str] = []
        self.last_export: tuple[Path, Path] | None = None

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
        self.worker.submit(ew.LoadCommand(self.spec, self.settings.system_prompt, self.settings.thinking))
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

    # ------------------------------------------------------------------ handy getters

    @property
    def tree_panel(self) -> TreePanel:
        return self.main_screen.query_one(TreePanel)

    def _main_ready(self) -> bool:
        return self.main_screen is not None and self.main_screen.is_mounted

    def _q(self, selector: str, kind: type | None = None):
        return self.main_screen.query_one(selector, kind) if kind else self.main_screen.query_one(selector)

    @property
    def busy(self) -> bool:
        return self.chat_job is not None or self.aux_job is not None or bool(self.compare and self.compare.running)

    @property
    def algos(self) -> tuple[str, ...]:
        return self.engine_info.tree_algos if self.engine_info else ew.tree_algos(self.worker.backend) if self.worker.backend else ew.FALLBACK_TREE_ALGOS

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
            top.append(f"  {info.device} {info.dtype}", style=colors.muted)
        elif self.load_state == "loading":
            top.append(f"  loading {self.spec.model or 'the default model'}…", style=colors.muted)
        else:
            top.append("  no model loaded", style="bold red")
        top.append("  │  ", style=colors.muted)
        p = self.generation_params().spec
        if p.enabled:
            depth = "full" if p.depth is None else str(p.depth)
            top.append(f"budget {p.budget}", style=f"bold {colors.accepted}")
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
            t.append(f"  ·  context {context:,} / {self.engine_info.max_context:,} tokens", style=colors.muted)
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
        if self.compare_screen is not None and self.compare_screen.is_mounted:
            self.compare_screen.refresh_state()

    def on_resize(self, event) -> None:
        self._apply_size_classes(event.size)

    def _apply_size_classes(self, size=None) -> None:
        w, h = size if size is not None else self.size
        self.set_class(w < 100, "-narrow")
        self.set_class(w < 60 or h < 16, "-tiny")

    # ------------------------------------------------------------------ the drain

    async def _drain(self) -> None:
        if self._draining:
            return
        self._draining = True
        try:
            items = []
            while len(items) < MAX_ITEMS_PER_DRAIN:
                try:
                    items.append(self.outbox.get_nowait())
                except queue.Empty:
                    break
            for item in items:
                try:
                    await self._handle(item)
                except Exception:  # noqa: BLE001 - a UI bug must not take the app down
                    self._log_error("UI error while handling an engine event", traceback.format_exc())
            if items or self._dirty:
                await self._flush_updates()
        finally:
            self._draining = False

    async def drain_now(self) -> None:
        """Process everything the engine has reported so far (tests use it too)."""
        await self._drain()

    async def _handle(self, item: Any) -> None:
        if isinstance(item, ew.LoadProgress):
            self.load_progress = item
            self._dirty.add("loading")
        elif isinstance(item, ew.EngineReady):
            await self._engine_ready(item.info)
        elif isinstance(item, ew.EngineLoadFailed):
            await self._engine_load_failed(item)
        elif isinstance(item, ew.GenerationEvent):
            self._on_generation_event(item)
        elif isinstance(item, ew.CompareRunStarted):
            self._on_compare_started(item)
        elif isinstance(item, ew.CompareRunFinished):
            self._on_compare_finished(item)
        elif isinstance(item, ew.JobFinished):
            await self._on_job_finished(item)
        elif isinstance(item, ew.JobFailed):
            await self._on_job_failed(item)
        elif isinstance(item, ew.SpecApplied):
            self._on_spec_applied(item)
        elif isinstance(item, ew.SpecRejected):
            await self._on_spec_rejected(item)
        elif isinstance(item, ew.SessionSnapshot):
            await self._engine_snapshot(item)
        self._dirty.add("chrome")

    async def _flush_updates(self) -> None:
        for msg, text in list(self._pending.items()):
            if text:
                await msg.append(text)
        self._pending.clear()
        if self.settings.provenance and self.chat_job is not None:
            job = self.jobs.get(self.chat_job)
            if job and job.message and job.trace:
                job.message.show_provenance(job.trace.segments, SpecColors.from_app(self))
        dirty, self._dirty = self._dirty, set()
        if "loading" in dirty:
            self._show_loading()
        if "tree" in dirty:
            self.tree_panel.rounds_updated()
        if "stats" in dirty or "tree" in dirty:
            self._update_stats()
        if "compare" in dirty and self.compare_screen is not None and self.compare_screen.is_mounted:
            self.compare_screen.refresh_state()
        self.refresh_chrome()

    def _show_loading(self) -> None:
        panel = self._q("#loading", LoadingPanel)
        if self.load_state != "loading":
            panel.display = False
            return
        panel.display = True
        p = self.load_progress
        title = f"Loading {self.spec.model or 'the default model'}"
        panel.set_progress(title, p.message if p else "starting", p.fraction if p else None)

    def _update_stats(self) -> None:
        trace = self.current_trace
        pos = self._tree_position
        stats = compute_stats(trace, self.baseline, upto=None if pos is None else pos + 1)
        self._q("#stats", StatsPanel).show(stats, replay_round=pos)

    # -- engine state

    async def _engine_ready(self, info: ew.EngineInfo) -> None:
        self.engine_info = info
        self.load_state = "ready"
        self._dirty.add("loading")
        if self.settings.tree_algo not in info.tree_algos:
            self.settings.tree_algo = info.tree_algos[0]
        head = f" with draft head {info.head_name}" if info.head_name else ""
        await self.add_note_async(
            f"Loaded {info.model_name}{head} on {info.device} ({info.dtype}), context {info.max_context:,} tokens.",
            "info",
        )
        if info.max_depth is None:
            await self.add_note_async(NO_HEAD_NOTE, "warning")

    async def _engine_load_failed(self, item: ew.EngineLoadFailed) -> None:
        self.load_state = "failed"
        self.load_error = item.message
        self._dirty.add("loading")
        if item.details:
            self._log_error("model load failed", item.details)
        hint = " Details are in " + str(error_log_path()) + "." if item.details else ""
        await self.add_note_async(f"Could not load the model: {item.message.rstrip('.')}.{hint}", "error")

    # -- generation events

    def _on_generation_event(self, item: ew.GenerationEvent) -> None:
        if item.kind == "compare":
            self._on_compare_event(item)
            return
        job = self.jobs.get(item.job_id)
        if job is None or job.trace is None:
            return
        text = job.trace.add(item.event)
        if isinstance(item.event, PrefillEvent):
            self.last_prefill = item.event
        if job.kind == "chat":
            if text and job.message is not None:
                self._pending[job.message] = self._pending.get(job.message, "") + text
            if isinstance(item.event, (RoundEvent, FinishEvent)):
                self._dirty.add("tree")

    async def _on_job_finished(self, item: ew.JobFinished) -> None:
        job = self.jobs.get(item.job_id)
        if job is None:
            return
        if job.kind == "chat":
            await self._finish_message(job)
            trace = job.trace
            if trace is not None and trace.result is not None and job.message is not None:
                if job.message.raw != trace.result.text:  # the result's text is authoritative
                    await job.message.set_text(trace.result.text)
                job.message.set_label("jetspec · " + trace.label)
                job.message.set_meta(*self._meta_for(trace))
                if not trace.speculated and trace.result.rounds:
                    self.baseline = ArBaseline(trace.result.tokens_per_second, f"plain AR answer, turn {job.turn}")
            if self.chat_job == item.job_id:
                self.chat_job = None
            self._dirty.update({"tree", "stats"})
        elif job.kind == "rerun":
            trace = job.trace
            if self.aux_job == item.job_id:
                self.aux_job = None
            if trace is not None and trace.result is not None and trace.result.rounds and not item.cancelled:
                r = trace.result
                self.baseline = ArBaseline(r.tokens_per_second, f"AR rerun of turn {job.turn}, {r.new_tokens} tokens")
                await self.add_note_async(
                    f"Plain AR on the last prompt: {r.tokens_per_second:.1f} tokens/s "
                    f"({r.new_tokens} tokens, {r.decode_seconds * 1000 / max(1, r.rounds):.1f} ms/token). "
                    "Speedups are now measured against it.",
                    "info",
                )
            elif item.cancelled:
                await self.add_note_async("AR measurement stopped.", "warning")
            self._dirty.add("stats")
        elif job.kind == "compare":
            self._on_compare_done(item)
        if not self.busy:
            self.stopping = False

    async def _on_job_failed(self, item: ew.JobFailed) -> None:
        job = self.jobs.get(item.job_id)
        if item.details:
            self._log_error(f"{item.kind} failed", item.details)
        hint = f" (details in {error_log_path()})" if item.details else ""
        message = f"{item.message}{hint}"
        if job is not None and job.kind == "chat":
            await self._finish_message(job)
            if job.trace is not None:
                job.trace.error = item.message
            msg = job.message
            if msg is not None and not msg.raw.strip():
                await msg.remove()
                await self.add_note_async(f"Engine error: {message}", "error")
            elif msg is not None:
                msg.set_meta(f"⚠ stopped by an engine error: {message}", "error")
            if self.chat_job == item.job_id:
                self.chat_job = None
        elif job is not None and job.kind == "rerun":
            if self.aux_job == item.job_id:
                self.aux_job = None
            await self.add_note_async(f"AR measurement failed: {message}", "error")
        elif job is not None and job.kind == "compare":
            if self.compare is not None:
                self.compare.running = False
            self._dirty.add("compare")
            await self.add_note_async(f"Comparison failed: {message}", "error")
        else:
            await self.add_note_async(f"Engine error: {message}", "error")
        if not self.busy:
            self.stopping = False
        self._dirty.update({"tree", "stats"})

    async def _finish_message(self, job: Job) -> None:
        msg = job.message
        if msg is None:
            return
        pending = self._pending.pop(msg, "")
        if pending:
            await msg.append(pending)
        await msg.finish()
        if self.settings.provenance and job.trace is not None:
            msg.show_provenance(job.trace.segments, SpecColors.from_app(self))

    def _meta_for(self, trace: AnswerTrace) -> tuple[Text, str]:
        r = trace.result
        assert r is not None
        colors = SpecColors.from_app(self)
        t = Text(no_wrap=False)
        kind = ""
        parts = [f"{r.new_tokens} tokens", f"{r.tokens_per_second:.1f} tok/s"]
        speculated = trace.speculated
        if speculated:
            parts.append(f"τ {r.mean_accept_length:.2f}")
        parts.append(f"{r.rounds} rounds")
        if self.baseline is not None and speculated and r.tokens_per_second:
            parts.append(f"{r.tokens_per_second / self.baseline.tokens_per_second:.2f}× vs AR")
        t.append(" · ".join(parts), style=colors.muted)
        reason = {
            "eos": "",
            "stop": "",
            "length": "stopped at the max new tokens limit",
            "context_full": r.message or "the context window is full",
            "cancelled": "stopped (Esc)",
        }.get(r.finish_reason, r.finish_reason)
        if reason:
            t.append(f" · {reason}", style=f"bold {colors.bonus}")
            kind = "warning"
        if r.prefill_tokens or r.reused_tokens:
            reused = f", {r.reused_tokens:,} reused from the KV cache" if r.reused_tokens else ""
            t.append(f"\nprefill {r.prefill_tokens:,} new tokens{reused}", style=colors.muted)
        return t, kind

    # -- session snapshots

    async def _engine_snapshot(self, item: ew.SessionSnapshot) -> None:
        self.session_data = item.data
        self.session_messages = item.messages
        self.context_tokens = item.context_tokens
        job = self.jobs.get(item.job_id)
        if job is None:
            return
        if job.kind in ("rerun", "compare"):
            self._keep_original_answer(job, item)
        if job.kind in ("chat", "rerun", "compare") and self.session_name:
            self._autosave()
        if job.kind != "chat" or (self.chat_job != item.job_id):
            self.jobs.pop(item.job_id, None)

    def _keep_original_answer(self, job: Job, item: ew.SessionSnapshot) -> None:
        """Reruns replace the last answer in the session. When the text changed (a run was
        stopped early, or sampling drew another answer), put the original conversation back:
        the chat keeps showing it and the next turn continues from it."""
        before = job.pre_session
        if before is None:
            return
        old = [m for m in before.get("messages", []) if m.get("role") == "assistant"]
        new = [m for m in item.messages if m.get("role") == "assistant"]
        if old and new and old[-1].get("content") == new[-1].get("content"):
            return
        self.worker.submit(ew.RestoreSessionCommand(before))
        self.session_data = before
        self.session_messages = tuple(before.get("messages", []))
        self.add_note(
            "Kept the original answer (the rerun's text differed); its KV cache is rebuilt on the next turn.",
            "info",
        )

    # ------------------------------------------------------------------ sending

    @on(ChatInput.Submitted)
    async def _submitted(self, event: ChatInput.Submitted) -> None:
        await self.send_message(event.text)

    async def send_message(self, text: str) -> bool:
        if not text.strip():
            return False
        if self.load_state == "failed":
            await self.add_note_async(
                f"No model is loaded ({self.load_error}). Retry from the command palette (ctrl+p: Retry loading).",
                "error",
            )
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

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in _MAIN_ONLY_ACTIONS and self.screen is not self.main_screen:
            if not (action == "compare" and self.screen is self.compare_screen):
                return False
        if action == "stop":
            return True if self.busy else None
        return True

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

    # -- compare

    def action_compare(self) -> None:
        if self.compare_screen is not None and self.compare_screen.is_mounted:
            if self.screen is self.compare_screen:
                self.pop_screen()
            return
        if self.compare is None or not self.compare.running:
            if not self._ready_for_rerun("compare budgets"):
                return
            self.compare = CompareState(list(self.settings.compare_budgets), prompt=self.last_user_text() or "")
        self.compare_screen = CompareScreen(self.compare, ", ".join(self.settings.compare_budgets))
        self.push_screen(self.compare_screen)

    def start_compare(self, labels: list[str]) -> None:
        if self.busy:
            self.notify("Wait for the current run to finish, or press Esc to stop it.", severity="warning")
            return
        self.settings.compare_budgets = list(labels)
        self.save_settings()
        base = self.generation_params()
        entries = []
        for label in labels:
            if label == AR_LABEL:
                params = replace(base, spec=replace(base.spec, enabled=False))
            else:
                params = replace(base, spec=replace(base.spec, enabled=True, budget=int(label)))
            entries.append(ew.CompareEntry(label, params))
        state = CompareState(list(labels), prompt=self.last_user_text() or "", baseline=self.baseline)
        state.running = True
        state.job_id = self.worker.submit(ew.CompareCommand(tuple(entries)))
        self.jobs[state.job_id] = Job("compare", None, None, turn=self.turn, pre_session=copy.deepcopy(self.session_data))
        self.compare = state
        self._compare_params = {e.label: e.params for e in entries}
        if self.compare_screen is not None:
            self.compare_screen.set_state(state)
        self.refresh_chrome()

    def cancel_compare(self) -> None:
        if self.compare and self.compare.running and self.compare.job_id is not None:
            self.worker.cancel(self.compare.job_id)
            self.stopping = True

    def _on_compare_started(self, item: ew.CompareRunStarted) -> None:
        state = self.compare
        if state is None or state.job_id != item.job_id:
            return
        row = state.rows[item.index]
        row.status = "running"
        params = getattr(self, "_compare_params", {}).get(item.label, self.generation_params())
        trace = AnswerTrace(job_id=item.job_id, kind="compare", params=params, user_text=state.prompt)
        self.traces.append(trace)
        self._compare_trace = trace
        self._dirty.add("compare")

    def _on_compare_event(self, item: ew.GenerationEvent) -> None:
        state = self.compare
        if state is None or state.job_id != item.job_id:
            return
        trace = getattr(self, "_compare_trace", None)
        if trace is not None:
            trace.add(item.event)
        row = state.rows[item.run_index]
        ev = item.event
        if isinstance(ev, RoundEvent):
            row.live_rounds = ev.index + 1
            row.live_tokens = ev.answer_tokens
            prefill_s = trace.prefill.ms / 1000.0 if trace is not None and trace.prefill else 0.0
            decode_s = ev.elapsed_s - prefill_s
            row.live_tps = (ev.answer_tokens - 1) / decode_s if decode_s > 0 else None
        self._dirty.add("compare")

    def _on_compare_finished(self, item: ew.CompareRunFinished) -> None:
        state = self.compare
        if state is None or state.job_id != item.job_id:
            return
        row = state.rows[item.index]
        row.result = item.result
        row.error = item.error
        if item.error:
            row.status = "error"
        elif item.result is not None and item.result.finish_reason == "cancelled":
            row.status = "cancelled"
        else:
            row.status = "done"
        if row.label == AR_LABEL and row.status == "done" and row.tps:
            turn = self.jobs[item.job_id].turn if item.job_id in self.jobs else self.turn
            self.baseline = ArBaseline(row.tps, f"budget comparison, turn {turn}")
            self._dirty.add("stats")
        self._dirty.add("compare")

    def _on_compare_done(self, item: ew.JobFinished) -> None:
        state = self.compare
        if state is None or state.job_id != item.job_id:
            return
        state.running = False
        state.cancelled = item.cancelled
        for row in state.rows:
            if row.status in ("queued", "running"):
                row.status = "cancelled"
        self._dirty.update({"compare", "stats"})

    # -- speculation settings

    def _changed(self, what: str, *, live: bool = True) -> None:
        """A setting changed. Tree-shape changes (`live`) reach the answer in progress from its
        next round; everything else applies from the next answer."""
        self.save_settings()
        suffix = ""
        if self.chat_job is not None:
            suffix = " (from the next round)" if live and self._push_live_spec() else " (from the next answer)"
        self.notify(f"{what}{suffix}", timeout=2)
        self.refresh_chrome()

    def _push_live_spec(self) -> bool:
        """Send the settings' tree shape to the answer in progress; False if it has none to change."""
        job = self.jobs.get(self.chat_job) if self.chat_job is not None else None
        if job is None or job.trace is None or job.trace.finished:
            return False
        spec = self.generation_params().spec
        current = job.live_spec if job.live_spec is not None else job.trace.params.spec
        if spec == current:
            return False
        job.live_spec = spec
        self.worker.update_spec(self.chat_job, spec)
        return True

    def _on_spec_applied(self, item: ew.SpecApplied) -> None:
        job = self.jobs.get(item.job_id)
        if job is None or job.trace is None:
            return
        job.trace.add_spec_change(item.from_round, item.spec)
        if job.message is not None:
            job.message.set_label("jetspec · " + job.trace.label)
        self._dirty.update({"tree", "stats"})

    async def _on_spec_rejected(self, item: ew.SpecRejected) -> None:
        job = self.jobs.get(item.job_id)
        if job is not None and job.live_spec == item.spec:
            job.live_spec = None
        await self.add_note_async(f"Could not change the tree during the answer: {item.message}", "warning")

    def action_budget(self, direction: int) -> None:
        self.set_budget(step_in(BUDGET_STEPS, self.settings.budget, direction))

    def set_budget(self, budget: int) -> None:
        self.settings.budget = budget
        if not self.settings.speculation:
            self.settings.speculation = True
        self._changed(f"budget {budget}")

    def set_depth(self, depth: int | None) -> None:
        self.settings.depth = depth
        self._changed(f"depth {'full' if depth is None else depth}")

    def set_width(self, width: int) -> None:
        self.settings.width = width
        self._changed(f"width {width}")

    def set_algo(self, algo: str) -> None:
        self.settings.tree_algo = algo
        self._changed(f"tree algorithm {algo}")

    def action_next_algo(self) -> None:
        algos = list(self.algos)
        i = algos.index(self.settings.tree_algo) if self.settings.tree_algo in algos else -1
        self.set_algo(algos[(i + 1) % len(algos)])

    def action_toggle_spec(self) -> None:
        self.set_speculation(not self.settings.speculation)

    def set_speculation(self, on_: bool) -> None:
        if on_ and not self.has_head:
            self.notify(NO_HEAD_NOTE, severity="warning")
            return
        self.settings.speculation = on_
        self._changed("speculation on" if on_ else "speculation off: plain AR")

    def set_temperature(self, t: float) -> None:
        self.settings.temperature = t
        self._changed("greedy decoding" if t <= 0 else f"temperature {t:g}", live=False)

    def action_spec_settings(self) -> None:
        max_depth = self.engine_info.max_depth if self.engine_info else None

        def done(values: Settings | None) -> None:
            if values is None:
                return
            provenance_changed = values.provenance != self.settings.provenance
            new_chat_changed = (values.thinking, values.system_prompt) != (self.settings.thinking, self.settings.system_prompt)
            if values.speculation and not self.has_head:
                values.speculation = False
            before = self.generation_params()
            self.settings = values
            after = self.generation_params()
            if provenance_changed:
                self._apply_provenance()
            notes = []
            if self.chat_job is not None and (before.sampling, before.max_new_tokens) != (after.sampling, after.max_new_tokens):
                notes.append("sampling and length: from the next answer")
            if new_chat_changed:
                notes.append("thinking and system prompt: new chats")
            self._changed("settings applied" + (f" ({'; '.join(notes)})" if notes else ""))

        self.push_screen(SpecSettingsScreen(self.settings, self.algos, max_depth), done)

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

    def action_export(self) -> None:
        directory = exports_dir()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            svg = self.save_screenshot(f"jetspec-{stamp}.svg", str(directory))
            trace_path = directory / f"jetspec-{stamp}.trace.jsonl"
            lines: list[str] = []
            for i, trace in enumerate(self.traces):
                lines.extend(trace.to_jsonl_lines(i))
            atomic_write_text(trace_path, "\n".join(lines) + ("\n" if lines else ""))
        except OSError as err:
            self.add_note(f"Export failed: {err}", "error")
            return
        rounds = sum(len(t.rounds) for t in self.traces)
        self.last_export = (Path(svg), trace_path)
        self.add_note(f"Saved the screen to {svg} and the round trace ({rounds} rounds) to {trace_path}.", "info")
        self.notify(f"Saved {svg}\nand {trace_path}", timeout=6)

    # -- sessions

    def action_new_chat(self) -> None:
        self.action_stop()
        self.worker.submit(ew.NewSessionCommand(self.settings.system_prompt, self.settings.thinking))
        self._reset_chat_view()
        self.session_name = None
        self.session_data = None
        self.add_note("New chat (the previous conversation's KV cache was dropped).", "info")
        self.refresh_chrome()

    def _reset_chat_view(self) -> None:
        chat = self._q("#chat", ChatLog)
        chat.remove_children()
        self._pending.clear()
        self.traces = []
        self.current_trace = None
        self.last_prefill = None
        self.chat_job = None
        self.aux_job = None
        self._tree_position = None
        self.tree_panel.show_trace(None)
        self._update_stats()
        chat.follow()

    def action_save_session(self) -> None:
        messages = list(self.session_messages)
        if not any(m.get("role") == "user" for m in messages):
            self.notify("Nothing to save yet: send a message first.", severity="warning")
            return
        suggested = self.session_name or suggest_session_name(messages)
        existing = {s.name for s in self.store.list()}

        def done(name: str | None) -> None:
            if name:
                self.save_session_as(name)

        self.push_screen(SaveSessionScreen(suggested, existing), done)

    def save_session_as(self, name: str) -> Path | None:
        if self.session_data is None:
            self.notify("Nothing to save yet.", severity="warning")
            return None
        try:
            path = self.store.save(name, self.session_data, **self._session_meta())
        except SessionStoreError as err:
            self.add_note(f"Could not save the session: {err}", "error")
            return None
        self.session_name = path.stem
        self.add_note(f"Saved session {path.stem!r} to {path} (saved again after each answer).", "info")
        self.refresh_chrome()
        return path

    def _session_meta(self) -> dict:
        info = self.engine_info
        return {
            "model": info.model_name if info else self.spec.model,
            "draft_head": info.head_name if info else self.spec.draft_head,
            "extra": {"settings": dataclasses.asdict(self.generation_params())},
        }

    def _autosave(self) -> None:
        if not self.session_name or self.session_data is None:
            return
        try:
            self.store.save(self.session_name, self.session_data, **self._session_meta())
        except SessionStoreError as err:
            self.add_note(f"Autosave failed: {err}", "error")

    def action_open_session(self) -> None:
        def done(name: str | None) -> None:
            if name:
                self.open_session(name)

        self.push_screen(OpenSessionScreen(self.store.list()), done)

    def open_session(self, name: str) -> bool:
        try:
            data = self.store.load(name)
        except SessionStoreError as err:
            self.add_note(f"Could not open the session: {err}", "error")
            return False
        self.action_stop()
        self._restore(data, data.get("name") or name)
        return True

    def _open_requested_session(self, name: str) -> None:
        if self.store.exists(name):
            self.open_session(name)
        else:
            try:
                self.session_name = self.store.path_for(name).stem
            except SessionStoreError as err:
                self.add_note(f"--session: {err}", "error")
                return
            self.add_note(f"New session {self.session_name!r}: it is saved after each answer.", "info")

    def _restore(self, data: dict, name: str) -> None:
        session = data["session"]
        self.worker.submit(ew.RestoreSessionCommand(session, name))
        self._reset_chat_view()
        self.session_name = name
        self.session_data = session
        messages = [m for m in session.get("messages", []) if isinstance(m, dict)]
        self.session_messages = tuple(messages)
        thinking = bool(session.get("thinking", False))
        chat = self._q("#chat", ChatLog)
        widgets = []
        for m in messages:
            role, content = m.get("role"), str(m.get("content", ""))
            if role == "user":
                widgets.append(UserMessage(content))
            elif role == "assistant":
                widgets.append(AssistantMessage("jetspec", content, thinking_enabled=thinking, streaming=False))
            elif role == "system":
                widgets.append(NoteMessage(f"System prompt: {content}", "info"))
        n = sum(1 for m in messages if m.get("role") in ("user", "assistant"))
        widgets.append(
            NoteMessage(
                f"Opened session {name!r} ({n} messages). The KV cache is rebuilt by prefill on the next turn; "
                "after that, each turn reuses it.",
                "info",
            )
        )
        chat.mount_all(widgets)
        self.call_after_refresh(chat.follow)
        self.refresh_chrome()

    # -- themes, help

    def action_next_theme(self) -> None:
        names = self.cycle_themes or self.theme_names()
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        self.notify(f"theme {self.theme}", timeout=2)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_retry_load(self) -> None:
        if self.load_state != "failed":
            return
        self.load_state = "loading"
        self.load_progress = None
        self.worker.submit(ew.LoadCommand(self.spec, self.settings.system_prompt, self.settings.thinking))
        self._show_loading()
        self.refresh_chrome()

    def on_screen_resume(self) -> None:
        self.refresh_chrome()

    # -- command palette

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        c = SystemCommand
        yield c("Compare budgets", "Rerun the last prompt at several budgets and plain AR", self.action_compare)
        yield c("Measure plain AR speed", "Rerun the last prompt without speculation (for the speedup)", self.action_measure_ar)
        yield c("Speculation settings…", "Budget, depth, width, tree algorithm, temperature, …", self.action_spec_settings)
        spec_on = self.settings.speculation
        yield c(
            f"Speculation: turn {'off' if spec_on else 'on'}",
            "Plain autoregressive decoding on the same engine" if spec_on else "Tree speculative decoding",
            self.action_toggle_spec,
        )
        cur = self.settings

        def mark(is_current: bool) -> str:
            return " (current)" if is_current else ""

        for b in BUDGET_STEPS:
            yield c(
                f"Budget: {b}",
                f"Draft tree of at most {b} node{'s' if b > 1 else ''}{mark(b == cur.budget)}",
                lambda b=b: self.set_budget(b),
            )
        max_depth = self.engine_info.max_depth if self.engine_info else None
        yield c("Depth: full", f"Draft as deep as the head's block allows{mark(cur.depth is None)}", lambda: self.set_depth(None))
        for d in range(1, (max_depth or 16)):
            yield c(f"Depth: {d}", f"Draft at most {d} tokens ahead{mark(d == cur.depth)}", lambda d=d: self.set_depth(d))
        for w in (1, 2, 4, 6, 8, 12, 16, 32):
            yield c(f"Width: {w}", f"Top-{w} candidates per depth{mark(w == cur.width)}", lambda w=w: self.set_width(w))
        for a in self.algos:
            yield c(f"Tree algorithm: {a}", f"How the draft tree is built{mark(a == cur.tree_algo)}", lambda a=a: self.set_algo(a))
        for t in (0.0, 0.6, 0.7, 1.0):
            yield c(
                f"Temperature: {t:g}" + (" (greedy)" if t == 0 else ""),
                "Sampling temperature for the next answers",
                lambda t=t: self.set_temperature(t),
            )
        yield c("Pause / follow the live tree", "Stop the tree view on a round, or follow the latest", self.action_tree_pause)
        yield c("Previous round", "Step the tree view back one round", lambda: self.action_tree_step(-1))
        yield c("Next round", "Step the tree view forward one round", lambda: self.action_tree_step(1))
        yield c("Replay the answer", "Show the rounds of the answer one by one", self.action_replay)
        for s in (1, 2, 4, 8, 16):
            yield c(f"Replay speed: {s} rounds/s", "Speed of the round-by-round replay", lambda s=s: self.set_replay_speed(s))
        yield c("Toggle provenance colors", "Color the answer: accepted draft tokens vs target tokens", self.action_toggle_provenance)
        yield c("Toggle tree scores", "Show the cumulative log-probabilities next to tree nodes", self._toggle_scores)
        yield c("Copy the last answer", "To the clipboard", self.action_copy_answer)
        yield c("Copy the last code block", "To the clipboard", self.action_copy_code)
        yield c("New chat", "Start over and drop the KV cache", self.action_new_chat)
        yield c("Save session…", "Save this chat to the data directory", self.action_save_session)
        yield c("Open session…", "Reopen a saved chat", self.action_open_session)
        yield c(
            f"Thinking: turn {'off' if self.settings.thinking else 'on'} (new chats)",
            "Qwen3 thinking mode for the next new chat",
            self._toggle_thinking,
        )
        for name in self.cycle_themes:
            yield c(f"Theme: {name}", "Switch the color theme", lambda n=name: setattr(self, "theme", n))
        yield c("Export screen and round trace", "SVG of the screen and JSONL of every round", self.action_export)
        yield c("Help: keys", "All keys and what the tree shows", self.action_help)
        if self.load_state == "failed":
            yield c("Retry loading the model", "Try to load the model again", self.action_retry_load)

    def _toggle_scores(self) -> None:
        self.settings.show_scores = not self.settings.show_scores
        self.tree_panel.show_scores = self.settings.show_scores
        self.save_settings()

    def _toggle_thinking(self) -> None:
        self.settings.thinking = not self.settings.thinking
        self._changed(f"thinking {'on' if self.settings.thinking else 'off'} for new chats (ctrl+n)", live=False)

    # ------------------------------------------------------------------ errors

    def _log_error(self, what: str, details: str) -> None:
        try:
            path = error_log_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n{details}\n")
        except OSError:
            pass
