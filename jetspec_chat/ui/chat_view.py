"""What the main screen shows of the chat: notes, the top bar and status line, the loading
panel, the tree and stats, and the batched streaming text.

`ChatView` reads `ChatController` and draws; it changes no chat state but its own (text not
drawn yet, what needs a redraw, the round the tree shows). Engine reports mark what changed
(`dirty`) and queue text (`pending`); `flush` draws them in one frame (frames.py decides when).
"""
from __future__ import annotations

from rich.text import Text
from textual.app import App
from textual.widgets import Static

from .chat import AssistantMessage, ChatInput, ChatLog, NoteMessage, last_code_block
from .compare import CompareScreen
from .controller import ChatController
from .frames import FrameBudget
from .jobs import Job
from .liveness import can_update
from .main_screen import LoadingPanel, MainScreen, context_label
from .stats import StatsPanel
from .themes import SpecColors
from .trace import AnswerTrace, compute_stats, mean_round_ms, prefill_line, speedup
from .tree_view import TreePanel


class ChatView:
    """Draws the chat on the main screen (and refreshes the compare screen when it is open)."""

    def __init__(self, app: App, chat: ChatController, screen: MainScreen, *, demo: bool) -> None:
        """`app`: for notifications, the theme's colors and the clipboard. `demo`: the top bar
        says the engine and its numbers are scripted."""
        self.app = app
        self.chat = chat
        self.screen = screen
        self.demo = demo
        self.compare_screen: CompareScreen | None = None
        self.pending: dict[AssistantMessage, str] = {}  # streamed text not drawn yet
        self.dirty: set[str] = set()  # what needs a redraw: loading, tree, stats, compare, chrome
        self.frames = FrameBudget()  # how often the drain may redraw (frames.py)
        self.tree_position: int | None = None  # the round the tree shows (None: the latest)

    # ------------------------------------------------------------------ widgets

    def ready(self) -> bool:
        return can_update(self.screen)

    @property
    def tree_panel(self) -> TreePanel:
        return self.screen.query_one(TreePanel)

    @property
    def chat_log(self) -> ChatLog:
        return self.screen.query_one("#chat", ChatLog)

    @property
    def chat_input(self) -> ChatInput:
        return self.screen.query_one("#input", ChatInput)

    def assistant_messages(self) -> list[AssistantMessage]:
        return list(self.chat_log.query(AssistantMessage))

    # ------------------------------------------------------------------ notes and settings

    async def add_note_async(self, text: str, kind: str = "info") -> None:
        await self.chat_log.mount(NoteMessage(text, kind))

    def add_note(self, text: str, kind: str = "info") -> None:
        self.chat_log.mount(NoteMessage(text, kind))

    def save_settings(self) -> None:
        error = self.chat.save_settings()
        if error:
            self.app.notify(error, severity="warning")

    # ------------------------------------------------------------------ chrome

    def refresh_chrome(self) -> None:
        """Top bar and status line."""
        if not self.ready():
            return
        chat = self.chat
        colors = SpecColors.from_app(self.app)
        top = Text(no_wrap=True, overflow="ellipsis")
        top.append("jetspec-chat", style="bold")
        info = chat.engine_info
        if info is not None:
            top.append(f"  {info.model_name}", style="bold")
            top.append(f" + {info.head_name}" if info.head_name else "  (no draft head)", style=colors.muted)
            if self.demo:
                top.append("  DEMO: a scripted engine, its numbers are made up", style=f"bold {colors.bonus}")
            else:
                top.append(f"  {info.device} {info.dtype}", style=colors.muted)
        elif chat.load_state == "loading":
            top.append(f"  loading {chat.engine_setup.model or 'the default model'}…", style=colors.muted)
        else:
            top.append("  no model loaded", style="bold red")
        top.append("  │  ", style=colors.muted)
        p = chat.generation_params().spec
        if p.enabled:
            depth = "full" if p.depth is None else str(p.depth)
            # Until the engine reports its device, an automatic budget is not known yet.
            budget = "auto" if chat.settings.budget_auto and info is None else str(p.budget)
            top.append(f"budget {budget}", style=f"bold {colors.accepted}")
            top.append(f" · depth {depth} · width {p.width} · {p.tree_algo}")
        elif info is not None and info.max_depth is None:
            top.append("no draft head: speculation off (plain AR)", style=f"bold {colors.bonus}")
        else:
            top.append("speculation OFF (plain AR)", style=f"bold {colors.bonus}")
        if chat.settings.temperature > 0:
            top.append(f" · T={chat.settings.temperature:g}")
        if chat.session_name:
            top.append(f"  │  session {chat.session_name}", style=colors.muted)
        self.screen.query_one("#topbar", Static).update(top)
        self.screen.query_one("#status", Static).update(self._status_text(colors))

    def _status_text(self, colors: SpecColors) -> Text:
        chat = self.chat
        t = Text(no_wrap=True, overflow="ellipsis")
        if chat.load_state == "loading":
            progress = chat.load_progress
            pct = f" {progress.fraction * 100:.0f}%" if progress and progress.fraction is not None else ""
            t.append(f"loading{pct}: {progress.message if progress else 'starting'}", style=f"bold {colors.bonus}")
        elif chat.load_state == "failed":
            t.append("no model loaded", style="bold red")
        elif chat.stopping and chat.busy:
            t.append("stopping at the next round boundary…", style=f"bold {colors.bonus}")
        elif chat.chat_job is not None:
            trace = chat.jobs[chat.chat_job].trace if chat.chat_job in chat.jobs else None
            n = len(trace.rounds) if trace else 0
            t.append(f"generating · round {n}" if trace and trace.prefill else "prefilling…", style=f"bold {colors.accepted}")
            t.append("  (Esc stops)", style=colors.muted)
        elif chat.aux_job is not None:
            trace = chat.jobs[chat.aux_job].trace if chat.aux_job in chat.jobs else None
            t.append(f"measuring plain AR · round {len(trace.rounds) if trace else 0}", style=f"bold {colors.bonus}")
            t.append("  (Esc stops)", style=colors.muted)
        elif chat.compare and chat.compare.running:
            t.append("comparing budgets… (F6 shows it)", style=f"bold {colors.bonus}")
        else:
            t.append("ready", style=f"bold {colors.accepted}")
        if chat.engine_info is not None:
            context = chat.context_tokens
            live = chat.jobs.get(chat.chat_job) if chat.chat_job is not None else None
            if live is not None and live.trace is not None and live.trace.rounds:
                context = live.trace.rounds[-1].context_tokens  # while streaming: the engine's count
            limit = chat.engine_info.max_context
            t.append(f"  ·  {context_label(context, limit)}",
                     style=f"bold {colors.bonus}" if context >= limit else colors.muted)
        if chat.last_prefill is not None:
            t.append(f"  ·  {prefill_line(chat.last_prefill)}", style=colors.muted)
        return t

    def show_loading(self) -> None:
        panel = self.screen.query_one("#loading", LoadingPanel)
        if self.chat.load_state != "loading":
            panel.display = False
            return
        panel.display = True
        p = self.chat.load_progress
        title = f"Loading {self.chat.engine_setup.model or 'the default model'}"
        panel.set_progress(title, p.message if p else "starting", p.fraction if p else None)

    # ------------------------------------------------------------------ tree and stats

    def show_trace(self, trace: AnswerTrace | None) -> None:
        """The tree and stats follow `trace` from its latest round."""
        self.tree_position = None
        self.tree_panel.show_trace(trace)
        self.update_stats()

    def update_stats(self) -> None:
        trace = self.chat.current_trace
        pos = self.tree_position
        stats = compute_stats(trace, self.chat.baselines.for_trace(trace), upto=None if pos is None else pos + 1)
        self.screen.query_one("#stats", StatsPanel).show(stats, replay_round=pos)

    def reset_chat(self) -> None:
        """An empty chat: no messages, nothing pending, an empty tree."""
        chat_log = self.chat_log
        chat_log.remove_children()
        self.pending.clear()
        self.show_trace(None)
        chat_log.follow()

    # ------------------------------------------------------------------ answers

    def apply_provenance(self) -> None:
        self.chat_log.set_class(self.chat.settings.provenance, "-provenance")
        self.refresh_provenance_all()

    def refresh_provenance_all(self) -> None:
        if not self.chat.settings.provenance or not self.ready():
            return
        colors = SpecColors.from_app(self.app)
        for msg in self.assistant_messages():
            trace = msg.trace
            msg.show_provenance(trace.segments if trace is not None else msg.segments, colors)

    async def finish_message(self, job: Job) -> None:
        msg = job.message
        if msg is None:
            return
        pending = self.pending.pop(msg, "")
        if pending:
            await msg.append(pending)
        await msg.finish()
        if self.chat.settings.provenance and job.trace is not None:
            msg.show_provenance(job.trace.segments, SpecColors.from_app(self.app))

    def meta_for(self, trace: AnswerTrace) -> tuple[Text, str]:
        """The line under a finished answer: its numbers, and why it stopped when that is news."""
        r = trace.result
        assert r is not None
        colors = SpecColors.from_app(self.app)
        t = Text(no_wrap=False)
        kind = ""
        parts = [f"{r.new_tokens} tokens", f"{r.tokens_per_second:.1f} tok/s"]
        speculated = trace.speculated
        if speculated:
            parts.append(f"τ {r.mean_accept_length:.2f}")
        parts.append(f"{r.rounds} rounds")
        gain = speedup(r.mean_accept_length, mean_round_ms(trace.rounds), self.chat.baselines.for_trace(trace))
        if speculated and gain is not None:
            parts.append(f"{gain:.2f}× vs AR on this prompt")
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

    async def flush(self) -> None:
        """Draw the pending text and everything marked dirty, in one frame."""
        for msg, text in list(self.pending.items()):
            if text:
                await msg.append(text)
        self.pending.clear()
        chat = self.chat
        if chat.settings.provenance and chat.chat_job is not None:
            job = chat.jobs.get(chat.chat_job)
            if job and job.message and job.trace:
                job.message.show_provenance(job.trace.segments, SpecColors.from_app(self.app))
        dirty, self.dirty = self.dirty, set()
        if "loading" in dirty:
            self.show_loading()
        if "tree" in dirty:
            self.tree_panel.rounds_updated()
        if "stats" in dirty or "tree" in dirty:
            self.update_stats()
        if "compare" in dirty and can_update(self.compare_screen):
            self.compare_screen.refresh_state()
        self.refresh_chrome()

    # ------------------------------------------------------------------ clipboard

    def copy_answer(self) -> None:
        for msg in reversed(self.assistant_messages()):
            text = msg.answer_text
            if text.strip():
                self.app.copy_to_clipboard(text)
                self.app.notify(f"Copied the last answer ({len(text):,} characters).", timeout=2)
                return
        self.app.notify("No answer to copy yet.", severity="warning")

    def copy_code(self) -> None:
        for msg in reversed(self.assistant_messages()):
            code = last_code_block(msg.answer_text)
            if code is not None:
                self.app.copy_to_clipboard(code)
                self.app.notify(f"Copied the last code block ({len(code.splitlines())} lines).", timeout=2)
                return
        self.app.notify("No code block in the answers yet.", severity="warning")
