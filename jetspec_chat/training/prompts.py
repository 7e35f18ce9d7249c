"""Training prompts that need no internet, and the small built-in evaluation sets.

Generators (deterministic for a seed on a given Python version):
- `api`:      instructions about Python standard-library functions and classes, read with
              `inspect` (reimplement, explain, test, use in a program, pitfalls, compare);
- `snippet`:  tasks on the source of pure-Python standard-library functions (complete,
              explain, document, type, fix an injected bug, translate, refactor, test);
- `task`:     hand-written coding tasks x languages x phrasings;
- `chat`:     explanations, writing, advice and small arithmetic/reasoning questions from
              templates with random numbers.
None of them draws on public benchmarks (HumanEval, MBPP, GSM8K, MATH, MT-Bench,
LiveCodeBench). Prompts are split into train/dev by a hash of their text, so a dev prompt
is never trained on whatever the seed or count. The evaluation sets (engine/eval_sets.py) are
hand-written, disjoint from the generators' output, and kept out of every training set.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import random
import re
import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from ..engine.eval_sets import EVAL_SETS

DEV_PER_MILLE = 20  # ~2% of generated prompts are held out for evaluation
DEV_SEED = 0  # the dev prompts come from this stream whatever the run's seed

# Standard-library modules with rich, stable, pure-Python APIs.
STDLIB_MODULES = (
    "abc", "argparse", "base64", "bisect", "calendar", "collections", "colorsys", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "filecmp",
    "fnmatch", "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "hmac", "html",
    "html.parser", "http.cookies", "imghdr", "inspect", "ipaddress", "itertools", "json", "keyword",
    "linecache", "locale", "logging", "math", "mimetypes", "numbers", "operator", "os", "os.path",
    "pathlib", "pickle", "pprint", "queue", "quopri", "random", "re", "reprlib", "sched", "secrets",
    "shlex", "shutil", "smtplib", "statistics", "string", "struct", "subprocess", "tempfile",
    "textwrap", "threading", "time", "timeit", "tokenize", "traceback", "types", "typing",
    "unicodedata", "urllib.parse", "uuid", "warnings", "weakref", "zipfile", "zlib", "email.utils",
    "asyncio", "sqlite3", "xml.etree.ElementTree", "wave", "graphlib", "tomllib", "zoneinfo",
)

API_TEMPLATES = (
    "Write a Python function that reimplements `{qual}` without calling it. The documentation says: "
    "\"{doc}\" Include a docstring and a couple of examples.",
    "Explain what `{qual}` does and show a short, runnable example.",
    "Write pytest unit tests for `{qual}`, covering normal use and edge cases.",
    "What are common mistakes or surprises when using `{qual}`? Give examples.",
    "Show how to use `{qual}` in a small but realistic Python script, and explain each step.",
    "I read that `{qual}` does this: \"{doc}\" Can you explain that in plain words?",
    "When would you use `{qual}` instead of writing the logic yourself? Give a concrete example.",
    "Write a command-line tool in Python built around `{qual}`, using argparse.",
    "Give three different examples of calling `{qual}` with different arguments and show the output.",
    "How would you implement the equivalent of `{qual}` in JavaScript?",
)

SNIPPET_TEMPLATES = (
    "Explain what this function from the Python standard library does, step by step:\n\n```python\n{src}\n```",
    "Add type hints and a clear docstring to this function:\n\n```python\n{src}\n```",
    "Write pytest tests for this function:\n\n```python\n{src}\n```",
    "Rewrite this Python function in {lang}:\n\n```python\n{src}\n```",
    "Refactor this function to be easier to read, without changing its behavior:\n\n```python\n{src}\n```",
    "What is the time complexity of this function? Explain.\n\n```python\n{src}\n```",
    "Review this code and suggest improvements:\n\n```python\n{src}\n```",
)
COMPLETE_TEMPLATE = "Complete this Python function:\n\n```python\n{head}\n```"
BUG_TEMPLATE = "There is a bug in this function. Find it, explain it and give the fixed code.\n\n```python\n{src}\n```"
TRANSLATION_LANGS = ("JavaScript", "TypeScript", "Go", "Rust", "Java", "C++", "C#", "Kotlin", "Swift", "Ruby")

# Small code mutations for "fix the bug" prompts: each makes a plausible, compilable mistake.
BUG_MUTATIONS = (
    (r" < ", " <= "), (r" <= ", " < "), (r" > ", " >= "), (r" >= ", " > "), (r" == ", " != "),
    (r" \+ 1\b", " - 1"), (r" - 1\b", " + 1"), (r"\band\b", "or"), (r"\bTrue\b", "False"),
    (r"\[1:\]", "[:-1]"), (r"\[0\]", "[-1]"), (r"\bappend\(", "extend("), (r"\bcontinue\b", "break"),
)

TASKS = (
    "checks whether a string is a palindrome, ignoring case and punctuation",
    "merges two sorted lists into one sorted list",
    "returns the n-th Fibonacci number using memoization",
    "parses a CSV file and returns the average of a numeric column",
    "finds the longest common prefix of a list of strings",
    "counts word frequencies in a text and returns the ten most common words",
    "flattens an arbitrarily nested list",
    "validates an email address with a reasonable regular expression",
    "converts a Roman numeral to an integer",
    "converts an integer to a Roman numeral",
    "implements binary search on a sorted array",
    "rotates a matrix by 90 degrees clockwise",
    "removes duplicates from a list while keeping the original order",
    "computes the edit distance between two strings",
    "groups anagrams from a list of words",
    "implements an LRU cache with get and put",
    "checks whether parentheses, brackets and braces in a string are balanced",
    "reads a JSON config file and fills in default values for missing keys",
    "implements a simple stack with push, pop and peek",
    "implements a queue using two stacks",
    "finds all prime numbers up to n with the sieve of Eratosthenes",
    "computes the greatest common divisor and least common multiple of two numbers",
    "splits a list into chunks of a given size",
    "debounces a function call",
    "retries a function with exponential backoff",
    "formats a number of bytes as a human-readable size (KB, MB, GB)",
    "parses a duration like '1h30m15s' into seconds",
    "walks a directory tree and lists the largest files",
    "computes a running median of a stream of numbers",
    "implements depth-first search on a graph given as an adjacency list",
    "implements breadth-first search and returns the shortest path in an unweighted graph",
    "implements Dijkstra's shortest path algorithm",
    "performs a topological sort of a dependency graph",
    "detects a cycle in a linked list",
    "reverses a singly linked list",
    "serializes a binary tree to a string and back",
    "checks whether a binary tree is a valid binary search tree",
    "computes the maximum subarray sum",
    "finds two numbers in an array that add up to a target",
    "implements quicksort",
    "implements merge sort",
    "implements a min-heap from scratch",
    "tokenizes a simple arithmetic expression",
    "evaluates an arithmetic expression with +, -, *, / and parentheses",
    "converts a snake_case string to camelCase",
    "wraps text to a given line width without breaking words",
    "computes the moving average of a list with a given window",
    "generates all permutations of a list",
    "generates all subsets of a set",
    "solves the N-queens problem",
    "validates a Sudoku board",
    "implements a trie with insert and prefix search",
    "rate-limits calls with a token bucket",
    "parses query parameters from a URL",
    "computes the checksum of a file in chunks",
    "renders a table of rows as aligned plain text",
    "implements a simple in-memory key-value store with expiry",
    "finds the k most frequent elements in a list",
    "checks whether two strings are one edit apart",
    "compresses a string with run-length encoding and decompresses it",
    "implements a thread-safe counter",
    "downloads several URLs concurrently and reports their sizes",
    "merges overlapping intervals",
    "computes the number of days between two dates",
    "converts temperatures between Celsius, Fahrenheit and Kelvin",
    "implements a simple event emitter with on, off and emit",
    "paginates a list of items",
    "deep-merges two dictionaries",
    "finds the median of two sorted arrays",
    "implements matrix multiplication",
    "checks whether a number is a power of two",
    "counts the set bits in an integer",
    "generates a random password with letters, digits and symbols",
    "parses a log file and counts errors per hour",
    "implements the game of life for one step",
    "implements a bank account class with deposit, withdraw and history",
    "computes the Levenshtein-closest word from a dictionary",
)
LANGUAGES = ("Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "C++", "C#", "Kotlin", "Ruby", "Bash")
TASK_TEMPLATES = (
    "Write a {lang} function that {task}.",
    "In {lang}, implement a function that {task}. Explain your approach briefly.",
    "Write {lang} code that {task}, with comments.",
    "Show an idiomatic {lang} solution for a function that {task}, and give a usage example.",
    "I need a {lang} function that {task}. Please also handle edge cases.",
    "Write a {lang} function that {task}, then write tests for it.",
)

TOPICS = (
    "recursion", "hash tables", "Big-O notation", "garbage collection", "the CAP theorem", "TCP vs UDP",
    "REST APIs", "database indexes", "transactions and isolation levels", "Git branching", "Docker containers",
    "virtual memory", "CPU caches", "floating-point rounding", "unicode and UTF-8", "public-key cryptography",
    "unit testing", "dependency injection", "functional programming", "event loops", "threads vs processes",
    "mutexes and deadlocks", "the observer pattern", "immutability", "type inference", "compilers vs interpreters",
    "regular expressions", "continuous integration", "code review", "technical debt", "caching strategies",
    "load balancing", "message queues", "OAuth", "password hashing", "SQL joins", "NoSQL databases",
    "Python decorators", "Python generators", "Python context managers", "JavaScript promises",
    "Rust ownership", "Go goroutines", "memory leaks", "profiling a slow program", "logging best practices",
    "semantic versioning", "writing good commit messages", "pair programming", "time management",
    "learning a new language", "photosynthesis", "how vaccines work", "climate and weather", "black holes",
    "the water cycle", "plate tectonics", "compound interest", "inflation", "supply and demand",
    "healthy sleep habits", "public speaking", "saving money", "the history of the printing press",
)
CHAT_TEMPLATES = (
    "Explain {topic} to a beginner, with an analogy.",
    "Give me a concise overview of {topic}, then three key takeaways.",
    "What are the pros and cons of {topic}?",
    "Write a short blog post introduction about {topic}.",
    "What are common misconceptions about {topic}?",
    "Create a five-question quiz about {topic}, with answers.",
    "Summarize {topic} in one paragraph for a busy manager.",
    "How would you teach {topic} in a 30-minute lesson? Give an outline.",
)
WRITING = (
    "Write a polite email asking a colleague to review a pull request by {day}.",
    "Write a short poem about {thing}.",
    "Write a haiku about {thing}.",
    "Write a two-paragraph story about a {person} who finds {thing}.",
    "Write a product description for a {thing}.",
    "Draft a friendly message inviting the team to a {event} on {day}.",
    "Give me five name ideas for a {thing} startup.",
    "Write a limerick about a {person} and a {thing}.",
    "Suggest a packing list for a {n}-day trip to the mountains.",
    "Plan a {n}-day study schedule for learning {topic}.",
)
THINGS = ("lighthouse", "coffee machine", "old map", "robot", "garden", "bicycle", "violin", "comet", "library",
          "mechanical keyboard", "paper boat", "forest", "teapot", "telescope", "umbrella")
PEOPLE = ("programmer", "baker", "pilot", "teacher", "detective", "gardener", "student", "astronaut", "painter")
EVENTS = ("lunch", "retrospective", "hackathon", "board game night", "farewell party", "demo day")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun", "Kemal", "Lina")


def _reasoning(rng: random.Random) -> str:
    """Small arithmetic word problems from our own templates and random numbers."""
    a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 12)
    p, q = rng.sample(NAMES, 2)
    forms = (
        f"{p} has {a} stickers and gives {q} {min(a - 1, b)} of them. Then {p} buys {c} packs of 5. "
        f"How many stickers does {p} have now? Show your reasoning.",
        f"A tank holds {a * 10} liters and leaks {c} liters per hour. After how many hours is it less than "
        f"half full? Explain step by step.",
        f"A phone plan costs {b} dollars a month plus {c} dollars per extra gigabyte. {p} used {c + 3} extra "
        f"gigabytes in {a % 5 + 2} months. What was the total bill? Explain.",
        f"{p} walks {a} meters per minute and {q} walks {a + c} meters per minute, starting {b} minutes later "
        f"from the same place. When does {q} catch up? Show the steps.",
        f"What is {a} x {b} + {c} x {a}? Explain how to compute it in your head.",
        f"Is {a * b + c} a prime number? Explain how you check.",
        f"A garden has {c} rows of {b} tulips, and {p} plants {a} more. How many tulips are there now?",
        f"Convert {a * 37} minutes into hours and minutes, and explain the method.",
        f"{p} reads {b} pages a day. The book has {a * 9} pages. On which day does {p} finish? Explain.",
        f"{p} and {q} share {a * c} marbles so that {p} gets {c - 1 if c > 2 else 2} times as many as {q}. "
        f"Is that possible with whole marbles? Explain.",
    )
    return rng.choice(forms)


def _doc_line(obj) -> str | None:
    doc = inspect.getdoc(obj)
    if not doc:
        return None
    first = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    return first if 20 <= len(first) <= 300 and "`" not in first else None


def _import(name: str):
    """The module, or None where this Python lacks it (e.g. imghdr after 3.13); quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except Exception:  # noqa: BLE001 - any import failure just drops the module
            return None


def _defined_in(obj, module: str) -> bool:
    """Defined by this module (or its C accelerator, e.g. _heapq), not merely imported into it."""
    where = getattr(obj, "__module__", None) or ""
    if module in ("os", "os.path") and where == "posixpath":
        return True
    return where.lstrip("_").split(".")[0] == module.split(".")[0]


@functools.cache  # every PromptGenerator (train and dev streams) reads the same stdlib
def _api_items() -> tuple[tuple[str, str], ...]:
    """(qualified name, first doc paragraph) for public callables of the stdlib modules."""
    items = []
    for name in STDLIB_MODULES:
        mod = _import(name)
        if mod is None:
            continue
        for attr in sorted(getattr(mod, "__all__", None) or dir(mod)):
            if attr.startswith("_"):
                continue
            obj = getattr(mod, attr, None)
            if not callable(obj) or not _defined_in(obj, name):
                continue
            doc = _doc_line(obj)
            if doc:
                items.append((f"{name}.{attr}", doc))
    return tuple(items)


@functools.cache  # ~1 s of inspect.getsource; the same for every PromptGenerator
def _snippets() -> tuple[str, ...]:
    """Source of small pure-Python functions and methods of the stdlib modules (5-40 lines)."""
    out = []
    for name in STDLIB_MODULES:
        mod = _import(name)
        if mod is None:
            continue
        members = []
        for _, obj in sorted(vars(mod).items()):
            if inspect.isclass(obj) and obj.__module__ == mod.__name__:
                members += [m for _, m in sorted(vars(obj).items()) if inspect.isfunction(m)]
            elif inspect.isfunction(obj) and obj.__module__ == mod.__name__:
                members.append(obj)
        for fn in members:
            try:
                src = textwrap.dedent(inspect.getsource(fn))
            except (OSError, TypeError):
                continue
            lines = src.rstrip().splitlines()
            if 5 <= len(lines) <= 40 and len(src) <= 1600 and not lines[0].lstrip().startswith("@"):
                out.append(src.rstrip())
    return tuple(out)


def _inject_bug(src: str, rng: random.Random) -> str | None:
    for pattern, repl in rng.sample(BUG_MUTATIONS, len(BUG_MUTATIONS)):
        hits = list(re.finditer(pattern, src))
        if not hits:
            continue
        m = rng.choice(hits)
        mutated = src[: m.start()] + re.sub(pattern, repl, m.group(0)) + src[m.end():]
        try:
            compile(mutated, "<snippet>", "exec")
        except SyntaxError:
            continue
        return mutated
    return None


class PromptGenerator:
    """Deterministic infinite stream of prompts from the four generators, mixed by weight."""

    WEIGHTS = {"api": 0.3, "snippet": 0.3, "task": 0.22, "chat": 0.18}

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.api = _api_items()
        self.snippets = _snippets()

    def _api(self) -> str:
        qual, doc = self.rng.choice(self.api)
        return self.rng.choice(API_TEMPLATES).format(qual=qual, doc=doc)

    def _snippet(self) -> str:
        src = self.rng.choice(self.snippets)
        roll = self.rng.random()
        if roll < 0.2:
            lines = src.splitlines()
            cut = self.rng.randint(max(2, len(lines) // 3), max(2, 2 * len(lines) // 3))
            return COMPLETE_TEMPLATE.format(head="\n".join(lines[:cut]))
        if roll < 0.4:
            buggy = _inject_bug(src, self.rng)
            if buggy is not None:
                return BUG_TEMPLATE.format(src=buggy)
        return self.rng.choice(SNIPPET_TEMPLATES).format(src=src, lang=self.rng.choice(TRANSLATION_LANGS))

    def _task(self) -> str:
        return self.rng.choice(TASK_TEMPLATES).format(lang=self.rng.choice(LANGUAGES), task=self.rng.choice(TASKS))

    def _chat(self) -> str:
        roll = self.rng.random()
        if roll < 0.3:
            return _reasoning(self.rng)
        if roll < 0.65:
            return self.rng.choice(CHAT_TEMPLATES).format(topic=self.rng.choice(TOPICS))
        return self.rng.choice(WRITING).format(
            day=self.rng.choice(DAYS), thing=self.rng.choice(THINGS), person=self.rng.choice(PEOPLE),
            event=self.rng.choice(EVENTS), n=self.rng.randint(2, 10), topic=self.rng.choice(TOPICS),
        )

    def __iter__(self) -> Iterator[str]:
        kinds: list[Callable[[], str]] = [self._api, self._snippet, self._task, self._chat]
        weights = [self.WEIGHTS[k] for k in ("api", "snippet", "task", "chat")]
        if not self.api:
            weights[0] = 0.0
        if not self.snippets:
            weights[1] = 0.0
        while True:
            yield self.rng.choices(kinds, weights)[0]()


# Prompts the target proposes itself (`train-head --self-prompts`): it is asked for one user
# request at a time, sampled, and its answers (cleaned) become training prompts. This reaches
# phrasings and subjects our templates never produce, which matters most for general chat.
PROPOSE_TEMPLATES = (
    "Write one question a curious person might ask an AI assistant about {topic}. Reply with the question only.",
    "Write one realistic request a user could send to a helpful assistant about {thing}. Reply with the request only.",
    "Invent one everyday question someone might ask a chatbot, about anything. Reply with the question only.",
    "Write one message a {person} might send to an AI assistant to get help with their work. Reply with the message only.",
    "Write one request for a short piece of writing (an email, a story, a list, advice) that a user might ask "
    "an assistant for. Reply with the request only.",
    "Write one question a student might ask about {topic}, as they would type it. Reply with the question only.",
    # Coding asks in the user's words: the app's main use, and where the templates' phrasings are fixed.
    "Write one programming task a developer might ask an AI assistant to solve in {language}. "
    "Reply with the task only.",
    "Write one request a {person} learning to code might send to an AI assistant, asking for a small "
    "{language} program or function. Reply with the request only.",
)
_LEADS = ("question:", "request:", "message:", "user:", "prompt:")
_PREAMBLES = ("sure", "certainly", "of course", "here is", "here's", "here are")


# With real user messages at hand (ShareGPT's), half of the asks start from one of them: the
# templates alone make a few hundred distinct asks, an example makes each ask different.
PROPOSE_FROM_EXAMPLE = ("Here is a message someone once sent to an AI assistant:\n\n{example}\n\nWrite one new "
                        "message on a related subject, as another person would type it. Reply with the message only.")
EXAMPLE_CHARS = (12, 600)  # the user messages used as examples: short enough to stay one ask


def propose_requests(n: int, seed: int = 0, examples: tuple[str, ...] = ()) -> list[str]:
    """n instructions asking the target for one user request each (deterministic): from the
    templates, and from `examples` (real user messages) for every other one when there are any."""
    rng = random.Random(seed * 7919 + 17)
    out = []
    for i in range(n):
        if examples and i % 2:
            out.append(PROPOSE_FROM_EXAMPLE.format(example=rng.choice(examples)))
        else:
            out.append(rng.choice(PROPOSE_TEMPLATES).format(topic=rng.choice(TOPICS), thing=rng.choice(THINGS),
                                                            person=rng.choice(PEOPLE), language=rng.choice(LANGUAGES)))
    return out


def proposal_examples(prompts: list[Prompt]) -> tuple[str, ...]:
    """The first user message of each multi-message (chat) prompt, distinct, of EXAMPLE_CHARS length,
    in order: the real asks `propose_requests` may start from."""
    seen: dict[str, None] = {}
    for p in prompts:
        if isinstance(p, list) and p and p[0]["role"] == "user":
            text = p[0]["content"]
            if EXAMPLE_CHARS[0] <= len(text) <= EXAMPLE_CHARS[1]:
                seen.setdefault(text, None)
    return tuple(seen)


def clean_proposal(text: str) -> str | None:
    """The request in a proposal, or None: the first paragraph after any "Sure, here is one:"
    preamble, without a "Question:" style lead or quotes, 12-400 printable characters, mostly
    letters, and not itself an instruction to propose."""
    line = ""
    for para in (p.strip() for p in text.strip().split("\n\n")):
        low = para.lower()
        if low.startswith(_PREAMBLES):
            para = para.partition(":")[2].strip()
            if not para:
                continue  # a preamble on its own: the request follows
        elif low.startswith(_LEADS):
            para = para.partition(":")[2].strip()
        line = para
        break
    line = line.strip().strip('"\'“”*').strip()
    if not 12 <= len(line) <= 400 or "reply with" in line.lower():
        return None
    # Text, not bytes: printable (no control characters), no decoding errors, mostly letters.
    visible = [ch for ch in line if not ch.isspace()]
    if "\ufffd" in line or not all(part.isprintable() for part in line.split("\n")):
        return None
    if sum(ch.isalpha() for ch in visible) < max(8, 0.6 * len(visible)):
        return None
    return line


# A training prompt: one user message (str), or a multi-turn context (chat messages, the last one
# the user's turn the target answers).
Prompt = str | list[dict[str, str]]


def prompt_key(prompt: Prompt) -> str:
    """The text that identifies a prompt (dedupe, the dev split, the data's prompt hashes)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False)


def as_messages(prompt: Prompt) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def is_dev(prompt: str, per_mille: int = DEV_PER_MILLE) -> bool:
    """The train/dev split: a pure function of the prompt text, so it never changes between runs."""
    return int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16) % 1000 < per_mille


def split_prompts(prompts: list[Prompt], per_mille: int = DEV_PER_MILLE) -> tuple[list[Prompt], list[Prompt]]:
    train = [p for p in prompts if not is_dev(prompt_key(p), per_mille)]
    dev = [p for p in prompts if is_dev(prompt_key(p), per_mille)]
    return train, dev


def distinct(prompts: list[Prompt]) -> list[Prompt]:
    """The prompts without repeats, in order."""
    return list({prompt_key(p): p for p in reversed(prompts)}.values())[::-1]


def builtin_prompts(num_train: int, num_dev: int, seed: int = 0, per_mille: int = DEV_PER_MILLE,
                    max_tries_factor: int = 50) -> tuple[list[str], list[str]]:
    """`num_train` distinct training prompts from the stream of `seed`, and up to `num_dev`
    distinct dev prompts, always from the stream of DEV_SEED: runs with other seeds report τ on
    the same held-out prompts (is_dev keeps them out of every run's training side)."""
    held_out = {p for prompts in EVAL_SETS.values() for p in prompts}

    def take(stream_seed: int, n: int, want_dev: bool) -> list[str]:
        out: list[str] = []
        seen: set[str] = set()
        limit = max_tries_factor * max(n, 100) * (1000 // per_mille if want_dev else 1)
        for tries, p in enumerate(PromptGenerator(stream_seed)):
            if len(out) >= n or tries >= limit:
                break
            if p not in seen and p not in held_out and is_dev(p, per_mille) == want_dev:
                seen.add(p)
                out.append(p)
        return out

    return take(seed, num_train, False), take(DEV_SEED, num_dev, True)


def load_prompts_file(path: str | Path) -> list[Prompt]:
    """One JSON object per line (blank lines skipped): {"prompt": "..."} for one user message, or
    {"messages": [{"role": "user" | "assistant" | "system", "content": "..."}, ...]} for a
    multi-turn context ending in the user's turn the target answers."""
    out: list[Prompt] = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt = row["prompt"] if "prompt" in row else row["messages"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f'{path}:{n}: expected a JSON object with a "prompt" or "messages" field') from None
        if isinstance(prompt, list):
            if not _valid_messages(prompt):
                raise ValueError(f'{path}:{n}: "messages" must be role/content objects ending in a user turn')
        elif not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{path}:{n}: the prompt must be a non-empty string")
        out.append(prompt)
    return out


def _valid_messages(messages: list) -> bool:
    ok = all(isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
             and isinstance(m.get("content"), str) for m in messages)
    return ok and bool(messages) and messages[-1]["role"] == "user"
