"""The app's stylesheet (kept in Python so packaging never loses it)."""

APP_CSS = """
/* jetspec-chat layout. Colors come from the theme ($spec-* variables: see themes/*.toml). */

#topbar {
    height: 1;
    text-wrap: nowrap;
    text-overflow: ellipsis;
    background: $panel;
    color: $foreground;
    padding: 0 1;
}

#main {
    height: 1fr;
}

#chat-pane {
    width: 1fr;
    min-width: 20;
}

#side-pane {
    width: 1fr;
    min-width: 30;
}

App.-projector #side-pane {
    width: 3fr;
}

App.-projector #chat-pane {
    width: 2fr;
}

App.-narrow #main {
    layout: vertical;
}

App.-narrow #chat-pane {
    width: 1fr;
    height: 1fr;
}

App.-narrow #side-pane {
    width: 1fr;
    height: 1fr;
}

App.-narrow #stats, App.-narrow #tree-context, App.-narrow #tree-legend {
    display: none;
}

App.-tiny #side-pane {
    display: none;
}

App.-tiny #topbar, App.-tiny #status {
    display: none;
}

/* -- loading */

#loading {
    height: auto;
    margin: 1 1;
    padding: 0 1;
    border: round $primary;
}

#loading-label {
    height: auto;
}

#loading-bar {
    width: 1fr;
}

#loading-bar Bar {
    width: 1fr;
}

/* -- conversation */

#chat {
    height: 1fr;
    padding: 0 1;
    scrollbar-size-vertical: 1;
}

.message {
    height: auto;
    margin: 0 0 1 0;
}

.message .role {
    text-style: bold;
    color: $primary;
    height: 1;
}

.message.user .role {
    color: $accent;
}

.message.user .body {
    height: auto;
    padding: 0 1;
    background: $boost;
}

.message.assistant .answer {
    height: auto;
    margin: 0;
    padding: 0 1;
}

.message.assistant .provenance {
    display: none;
    height: auto;
    padding: 0 1;
}

#chat.-provenance .message.assistant .answer {
    display: none;
}

#chat.-provenance .message.assistant .provenance {
    display: block;
}

.message.assistant .meta {
    height: auto;
    padding: 0 1;
    color: $text-muted;
}

.message.assistant .meta.-error {
    color: $error;
    text-style: bold;
}

.thinking {
    height: auto;
    margin: 0 1;
    padding: 0;
    border-top: none;
    background: $boost;
}

.thinking .thinking-body {
    color: $text-muted;
    text-style: italic;
    height: auto;
}

.note {
    height: auto;
    margin: 0 0 1 0;
    padding: 0 1;
    color: $text-muted;
}

.note.-error {
    color: $error;
    text-style: bold;
    border-left: thick $error;
}

.note.-warning {
    color: $warning;
    border-left: thick $warning;
}

/* -- input */

#input {
    height: auto;
    min-height: 3;
    max-height: 10;
    border: tall $primary 60%;
}

#input:focus {
    border: tall $primary;
}

#status {
    height: 1;
    text-wrap: nowrap;
    text-overflow: ellipsis;
    padding: 0 1;
    background: $panel;
}

/* -- tree */

TreePanel {
    height: 1fr;
    border: round $primary 70%;
    border-title-color: $foreground;
    border-title-style: bold;
    border-subtitle-color: $text-muted;
    padding: 0 0 0 1;
}

TreePanel:focus {
    border: round $accent;
}

App.-projector TreePanel {
    border: heavy $accent;
    border-title-style: bold;
}

#tree-context {
    height: 3;
    margin-bottom: 1;
    text-overflow: ellipsis;
}

#tree-scroll {
    height: 1fr;
    scrollbar-size-vertical: 1;
}

#tree-body {
    width: auto;
    height: auto;
    text-wrap: nowrap;
}

#tree-legend {
    height: 1;
}

/* -- stats */

StatsPanel {
    height: auto;
    max-height: 50%;
    border: round $primary 70%;
    border-title-color: $foreground;
    border-title-style: bold;
    padding: 0 1;
}

#stats-top {
    height: 3;
}

#stats-digits {
    width: auto;
    color: $spec-bonus;
}

#stats-digits-label {
    width: 1fr;
    padding: 0 2;
}

#stats-lines {
    height: auto;
    text-wrap: nowrap;
    text-overflow: ellipsis;
}

.spark-row {
    height: 1;
}

.spark-label {
    width: 8;
    color: $text-muted;
}

.spark-row Sparkline {
    width: 1fr;
    height: 1;
}

.spark-row Sparkline > .sparkline--max-color {
    color: $spec-accepted;
}

.spark-row Sparkline > .sparkline--min-color {
    color: $spec-rejected;
}

#stats-hist {
    height: auto;
}

App.-projector #stats-hist {
    display: none;
}

/* -- compare screen */

#compare-title {
    height: 1;
    padding: 0 1;
    background: $panel;
}

#compare-controls {
    height: 3;
    padding: 0 1;
}

#compare-budgets-label {
    width: auto;
    padding: 1 1 0 0;
}

#compare-budgets {
    width: 1fr;
}

#compare-controls Button {
    margin-left: 1;
}

#compare-error {
    height: auto;
    padding: 0 1;
}

#compare-progress-row {
    height: 1;
    padding: 0 1;
}

#compare-progress {
    width: auto;
}

#compare-status {
    width: 1fr;
    padding: 0 1;
}

#compare-body {
    height: 1fr;
    padding: 1 1 0 1;
}

#compare-table {
    width: 3fr;
    height: 1fr;
}

#compare-plot {
    width: 2fr;
    height: 1fr;
    padding: 0 1;
    border: round $primary 70%;
}

/* -- dialogs */

ModalScreen {
    align: center middle;
}

.dialog {
    width: 76;
    max-width: 95%;
    height: auto;
    max-height: 90%;
    border: thick $primary;
    background: $surface;
    padding: 1 2;
}

.dialog-title {
    text-style: bold;
    color: $primary;
    margin-bottom: 1;
}

.dialog-label {
    margin-top: 1;
}

.dialog-help {
    color: $text-muted;
    margin-top: 1;
}

#settings-editor {
    height: auto;
}

#session-list {
    height: auto;
    max-height: 20;
}

#help {
    width: 90;
    height: 90%;
}
"""
