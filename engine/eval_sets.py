"""The built-in evaluation prompt sets: `coding` and `chat` (20 hand-written prompts each) and
`math` (12 short reasoning problems).

Both the benchmark (jetspec_chat/bench) and head training (jetspec_chat/training: the eval stage, replay,
and the prompt generators, which keep these prompts out of every training set) read them here.
They are disjoint from the training generators' output and draw on no public benchmark.
"""
from __future__ import annotations

EVAL_SETS: dict[str, tuple[str, ...]] = {
    "coding": (
        "Write a Python function that returns the second largest distinct value in a list, or None if there is none.",
        "Write a Python class `Matrix2x2` with addition, multiplication and a determinant method.",
        "Implement a Python generator that yields the lines of a file in reverse order without reading it all at once.",
        "Write a JavaScript function that deep-clones an object containing arrays, dates and nested objects.",
        "Write a Python function `slugify(title)` that turns a blog post title into a URL slug.",
        "Implement a simple tokenizer in Python that splits a string of Lisp code into parentheses, symbols and numbers.",
        "Write a SQL query that returns, for each customer, the date of their most recent order and its total.",
        "Write a Bash script that backs up a directory into a timestamped tar.gz file and keeps only the five newest.",
        "Write a Python function that checks whether a 9x9 grid of digits contains every digit once in each row.",
        "Write a Rust function that counts the vowels in a string slice.",
        "Implement a Python context manager that measures and prints how long its block took.",
        "Write a Python function that converts a list of (parent, child) pairs into a nested dictionary tree.",
        "Write a Go function that reverses the words in a sentence.",
        "Write a Python script that reads numbers from standard input and prints their mean and standard deviation.",
        "Implement a circular buffer class in Python with a fixed capacity.",
        "Write a TypeScript interface for a blog post and a function that sorts posts by publication date.",
        "Write a Python function that finds all pairs of words in a list that are reverses of each other.",
        "Write a C function that copies a string into a buffer safely, always terminating it.",
        "Write a Python decorator that caches a function's results to a JSON file on disk.",
        "Write a Python function that pretty-prints a duration given in seconds, like '2 h 5 min 7 s'.",
    ),
    "chat": (
        "What is the difference between a list and a tuple in Python, and when should I use each?",
        "Explain how a hash map handles collisions, in simple terms.",
        "I'm preparing a talk for new engineers about code reviews. What should I cover?",
        "Why does the sky look blue during the day and red at sunset?",
        "Give me a weekly meal-prep plan for a vegetarian on a budget.",
        "How do I politely decline a meeting invitation that conflicts with my focus time?",
        "Explain the difference between concurrency and parallelism with an everyday analogy.",
        "What should I look for when choosing a first programming language?",
        "Write a short motivational note for a friend starting a new job.",
        "What are some good habits for keeping a codebase maintainable over years?",
        "Describe how a bill becomes a law in a parliamentary system, in a few steps.",
        "How can I get better at estimating how long software tasks will take?",
        "Explain what an API is to someone who has never programmed.",
        "What are the main causes of the seasons on Earth?",
        "Suggest a beginner-friendly weekend project to learn about microcontrollers.",
        "How does compound interest work? Use a small numeric example.",
        "What is technical debt, and how do teams decide when to pay it down?",
        "Give me tips for writing clear documentation for an open-source library.",
        "How do noise-cancelling headphones work?",
        "Compare reading on paper and reading on a screen for learning.",
    ),
    "math": (
        "A train leaves at 9:40 and arrives at 13:05. How long is the journey in minutes? Show your steps.",
        "Solve for x: 3(x - 4) + 2 = 5x - 14. Explain each step.",
        "A shop sells pens at 3 for 2 euros. How much do 27 pens cost, and how many pens can you buy with 15 euros?",
        "What is the sum of all integers from 1 to 200 that are divisible by 3 or by 5? Reason step by step.",
        "A rectangle has a perimeter of 46 cm and its length is 5 cm more than its width. Find its area.",
        "Prove that the sum of two odd integers is always even.",
        "Two dice are rolled. What is the probability that the sum is at least 10? Show the counting.",
        "A recipe needs 250 g of flour for 4 people. How much flour is needed for 10 people, and for 3?",
        "A car uses 6.5 litres of fuel per 100 km. How far can it go on 42 litres? Explain.",
        "Find the greatest common divisor of 84 and 126 with Euclid's algorithm, showing each step.",
        "A price rises by 20% and then falls by 20%. Is it back where it started? Show why.",
        "How many different ways can 5 books be arranged on a shelf if two of them must stay side by side?",
    ),
}


def eval_prompts(kind: str) -> list[str]:
    """A built-in evaluation set: `coding`, `chat` or `math`."""
    if kind not in EVAL_SETS:
        raise ValueError(f"unknown eval set {kind!r}; choose {', '.join(EVAL_SETS)}")
    return list(EVAL_SETS[kind])
