"""The app's live speculation controls: budget, depth, width, tree algorithm, speculation
on/off and the settings dialog. Tree-shape changes reach the answer in progress from its next
round (through `EngineWorker.update_spec`); the rest applies from the next answer."""
from __future__ import annotations

from jetspec_chat.settings import Settings

from . import engine_worker as ew
from .dialogs import BUDGET_STEPS, SpecSettingsScreen, step_in


NO_HEAD_NOTE = "no draft head: speculation off (plain AR); pass --draft-head to speculate"
class LiveSpecMixin:
    """Part of `JetspecApp`: what F2-F5, ctrl+B and the palette's spec commands change."""

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
        self.settings.budget_auto = False
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
            if values.budget != self.settings.budget:
                values.budget_auto = False
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
