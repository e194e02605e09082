"""Instruction prompts for the target's own chat answers, built from templates and topics.

The prompts are generated (not collected), deterministically from a seed: every template is
crossed with topics and a random sample is kept. A stable hash decides the split: a prompt whose
sha256 ends in a byte below ``HELD_OUT_SHARE * 256`` is HELD OUT (never in a training corpus,
used only to measure acceptance). The benchmark prompts (``tsspec/data/prompts/bench.jsonl``)
are written by hand in another style and are never generated here; ``training_prompts`` also
drops any prompt whose text equals a benchmark turn, so neither set feeds the training corpus.
"""

from __future__ import annotations

import hashlib
import random

HELD_OUT_SHARE = 0.1

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "compound interest",
    "recursion in programming", "the immune system", "climate change", "the Roman Empire", "volcanoes",
    "machine learning", "the stock market", "healthy sleep", "electric cars", "the printing press",
    "honey bees", "the moon landing", "plate tectonics", "prime numbers", "public libraries",
    "coffee", "the internet", "vaccines", "renewable energy", "the human heart", "chess",
    "gardening", "bread baking", "time management", "the ocean tides", "rainbows", "earthquakes",
    "the Python language", "databases", "sorting algorithms", "Shakespeare", "jazz music",
    "the solar system", "bicycles", "recycling", "friendship", "learning a new language",
    "mountains", "deserts", "the Great Wall of China", "dinosaurs", "clouds", "magnets",
]

TEMPLATES = [
    "Explain {t} to a ten-year-old.",
    "Write a short paragraph about {t}.",
    "Give me three interesting facts about {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "Write a four-line poem about {t}.",
    "Summarize the history of {t} in a few sentences.",
    "How would you teach {t} to a beginner? List the steps.",
    "Write a short story that involves {t}.",
    "What is a common misconception about {t}?",
    "Describe {t} in simple words.",
    "Why is {t} important?",
    "Write a friendly email inviting a colleague to a talk about {t}.",
]

CODE_TASKS = [
    "Write a Python function that reverses a string.",
    "Write a Python function that checks whether a number is prime.",
    "How do I read a CSV file in Python?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain what a Python dictionary is, with an example.",
    "How do I sort a list of numbers in Python?",
    "Write a Python function that counts the vowels in a string.",
    "What does the `with` statement do in Python?",
    "Write a Python class for a simple bank account.",
    "How do I remove duplicates from a list in Python?",
    "Explain list comprehensions in Python with an example.",
    "Write a Python function that merges two sorted lists.",
    "How do I write to a text file in Python?",
    "What is the difference between `==` and `is` in Python?",
    "Write a Python function that computes the factorial of a number.",
    "Explain what a for loop is, with a Python example.",
]


def _math_prompts(rng: random.Random, count: int) -> list[str]:
    forms = [
        "What is {a} times {b}? Show your working.",
        "What is {a} plus {b}? Explain step by step.",
        "A shop sells apples for {a} cents each. How much do {b} apples cost?",
        "If a train travels {a} kilometres in {b} hours, what is its average speed?",
        "What is {a} minus {b}?",
        "A class has {a} students and {b} of them are absent. How many are present?",
        "Solve for x: x + {a} = {b}.",
        "What is {a} percent of {b}?",
    ]
    out = []
    for _ in range(count):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        out.append(rng.choice(forms).format(a=a, b=b))
    return out


def is_held_out(prompt: str) -> bool:
    """The stable split: True for prompts kept out of every training corpus."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return digest[-1] < int(HELD_OUT_SHARE * 256)


def all_prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct prompts (topics x templates, code tasks, arithmetic), in a seeded order."""
    rng = random.Random(seed)
    pool = [tpl.format(t=topic) for tpl in TEMPLATES for topic in TOPICS]
    pool += CODE_TASKS
    pool += _math_prompts(rng, max(16, count // 6))
    pool = list(dict.fromkeys(pool))  # distinct, first occurrence order
    rng.shuffle(pool)
    return pool[:count]


def _bench_texts() -> set[str]:
    import json
    from importlib import resources

    texts: set[str] = set()
    try:
        data = resources.files("tsspec").joinpath("data/prompts/bench.jsonl").read_text("utf-8")
    except (FileNotFoundError, ModuleNotFoundError):
        return texts
    for line in data.splitlines():
        if line.strip():
            for message in json.loads(line).get("messages", []):
                texts.add(message.get("content", "").strip())
    return texts


def training_prompts(count: int, seed: int = 0) -> list[str]:
    """Prompts allowed in a training corpus: not held out, not a benchmark turn."""
    bench = _bench_texts()
    return [p for p in all_prompts(count, seed) if not is_held_out(p) and p not in bench]


def held_out_prompts(count: int, seed: int = 0) -> list[str]:
    """Prompts never trained on (the held-out acceptance check)."""
    return [p for p in all_prompts(count, seed) if is_held_out(p)]
