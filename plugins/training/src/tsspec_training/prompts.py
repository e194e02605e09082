"""Instruction prompts for the target's own chat answers, built from templates and topics.

The prompts are generated (not collected), deterministically from a seed: every template is
crossed with topics and a random sample is kept. A stable hash decides the split: a prompt whose
sha256 ends in a byte below ``HELD_OUT_SHARE * 256`` is HELD OUT (never in a training corpus,
used only to measure acceptance). The benchmark prompts (``tsspec_bench/data/prompts/bench.jsonl``)
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


PROSE_TASKS = [
    "Write the opening paragraph of a short story about {t}.",
    "Write a friendly letter to a friend who is curious about {t}.",
    "Write a diary entry of someone spending a whole day thinking about {t}.",
    "Describe a quiet morning in a small town, and mention {t} somewhere in it.",
    "Write a short speech for a school assembly about {t}.",
    "Write a product description for a children's book about {t}.",
]

LIST_TASKS = [
    "List five questions a student might ask about {t}, with a one-line answer to each.",
    "Make a bulleted checklist for someone who wants to learn about {t}.",
    "Give a numbered list of the key terms related to {t} and define each one.",
    "Compare {t} and {u} in a short table or list.",
]

CHAT_TASKS = [
    "Hi! I just got interested in {t}. Where should I start?",
    "Thanks for your help earlier. Can you tell me a bit more about {t}?",
    "My friend says {t} is boring. How can I convince them otherwise?",
    "I have an exam about {t} tomorrow and I'm nervous. Any tips?",
    "Can you explain {t} again, but shorter this time?",
]

MORE_CODE_TASKS = [
    "Write a Python function that returns the largest element of a list without using max().",
    "Write a Python script that counts how often each word appears in a text file.",
    "Show how to turn a list of (name, age) tuples into a dictionary in Python, then sort it by age.",
    "Write a Python function that checks whether a string is a palindrome, and explain it.",
    "How do I handle a missing file with try and except in Python? Show an example.",
    "Write a Python generator that yields the squares of the numbers from 1 to n.",
    "Explain the difference between a list and a tuple in Python, with examples.",
    "Write a Python function that removes blank lines from a text file and writes the result back.",
    "How do I use enumerate in a for loop in Python?",
    "Write a Python function that flattens a list of lists.",
    "Write a Python dataclass for a book with a title, an author and a year.",
    "Show how to read a JSON file into a dictionary in Python and print one key.",
    "Write a Python function that converts a temperature from Celsius to Fahrenheit.",
    "Explain what `*args` and `**kwargs` mean in Python, with a short example.",
    "Write a Python function that groups words by their first letter.",
    "How do I get the current date and time in Python and format it as text?",
]

# instructions that carry a piece of text found on this machine (a standard-library docstring
# or function): the rewrite / summary / qa / code-edit shapes of real use
DOC_TASKS = [
    "Summarise the following documentation in three short bullet points.\n\n{doc}",
    "Rewrite the following documentation in plain, simple English for a beginner.\n\n{doc}",
    "Read the passage and explain in two sentences what it describes.\n\nPassage:\n{doc}",
    "Here is some documentation.\n\n{doc}\n\nWrite one paragraph that explains when someone would use this.",
    "Turn the following text into a Markdown list of its main points.\n\n{doc}",
]

CODE_EDIT_TASKS = [
    "Add type hints to this function and return the whole function.\n\n```python\n{code}```",
    "Add a docstring to this function and return the whole function, otherwise unchanged.\n\n```python\n{code}```",
    "Explain what this Python function does, step by step.\n\n```python\n{code}```",
    "Rename the first argument of this function to `value` and return the whole function.\n\n```python\n{code}```",
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
        "A rectangle is {a} metres long and {b} metres wide. What are its area and its perimeter?",
        "A farmer packs {a} eggs into boxes of {c}. How many full boxes are there, and how many eggs are left?",
        "Tom has {a} marbles and gives {c} to each of his {d} friends. How many marbles does he have left?",
        "A recipe needs {c} cups of flour for {d} people. How much flour is needed for {b} people?",
        "A bus leaves at {d}:00 and the trip takes {a} minutes. When does it arrive? Explain.",
        "What is the average of {a}, {b} and {c}? Show each step.",
        "A shirt costs {a} dollars and is on sale for {c} percent off. What is the sale price?",
        "Write {a}/{b} as a decimal, rounded to two places, and explain how.",
    ]
    out = []
    for _ in range(count):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        c, d = rng.randint(2, 12), rng.randint(2, 9)
        out.append(rng.choice(forms).format(a=a, b=b, c=c, d=d))
    return out


def _local_texts(rng: random.Random, count: int) -> tuple[list[str], list[str]]:
    """(docstrings, short function sources) of the standard library on this machine, seeded."""
    import ast

    from .corpus import _stdlib_files

    files = _stdlib_files()
    rng.shuffle(files)
    docs: list[str] = []
    code: list[str] = []
    for path in files:
        if len(docs) >= count and len(code) >= count:
            break
        try:
            text = path.read_text("utf-8")
            tree = ast.parse(text)
        except (UnicodeDecodeError, OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                doc = ast.get_docstring(node)
                if doc and 120 <= len(doc) <= 900 and len(docs) < count:
                    docs.append(doc)
                source = ast.get_source_segment(text, node) or ""
                if 150 <= len(source) <= 700 and len(code) < count:
                    code.append(source.rstrip() + "\n")
    return docs, code


def is_held_out(prompt: str) -> bool:
    """The stable split: True for prompts kept out of every training corpus."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return digest[-1] < int(HELD_OUT_SHARE * 256)


def all_prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct prompts in a seeded order: topics x templates (explanations, prose,
    lists, chat turns), code tasks, arithmetic word problems, and instructions over standard-
    library docstrings and functions (summaries, rewrites, code edits)."""
    rng = random.Random(seed)
    pool = [tpl.format(t=topic) for tpl in TEMPLATES for topic in TOPICS]
    pool += CODE_TASKS
    pool += _math_prompts(rng, max(16, count // 6))
    if count > len(pool) // 2:  # the larger corpora: more shapes (small counts keep the old pool)
        topics = list(TOPICS)
        for tpl in PROSE_TASKS + LIST_TASKS + CHAT_TASKS:
            for topic in rng.sample(topics, 12):
                pool.append(tpl.format(t=topic, u=rng.choice([x for x in topics if x != topic])))
        pool += MORE_CODE_TASKS
        pool += _math_prompts(rng, max(16, count // 6))
        docs, code = _local_texts(rng, max(8, count // 10))
        pool += [rng.choice(DOC_TASKS).format(doc=d) for d in docs]
        pool += [rng.choice(CODE_EDIT_TASKS).format(code=c) for c in code]
    pool = list(dict.fromkeys(pool))  # distinct, first occurrence order
    rng.shuffle(pool)
    return pool[:count]


def _bench_texts() -> set[str]:
    import json
    from importlib import resources

    texts: set[str] = set()
    try:
        data = resources.files("tsspec_bench").joinpath("data/prompts/bench.jsonl").read_text("utf-8")
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
