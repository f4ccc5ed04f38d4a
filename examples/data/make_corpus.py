"""Generate the bundled training corpus ``corpus.txt`` deterministically.

The corpus is synthetic, written by a seeded grammar (no third-party text, so no licence
question): short children's stories in which each story keeps its own cast, place and object
(so a model has to copy names from earlier in the context), some dialogue, small arithmetic
facts and lists. It is plain ASCII; the example trains on its bytes (vocabulary 256).

Usage::

    python examples/data/make_corpus.py            # rewrites examples/data/corpus.txt
    python examples/data/make_corpus.py --check    # exit 1 if corpus.txt differs from the generator

Only the standard library's ``random.Random`` (Mersenne Twister with an int seed,
``random()``/``randrange``-based helpers) is used, whose output is stable across Python versions.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from pathlib import Path

SEED = 2024
TARGET_BYTES = 400_000
OUT = Path(__file__).with_name("corpus.txt")

NAMES = [
    "Pip", "Lily", "Tom", "Mia", "Ben", "Zoe", "Max", "Ada", "Sam", "Nora", "Leo", "Ruby", "Finn",
    "Ivy", "Otto", "Lucy", "Jack", "Ella", "Hugo", "Rosa", "Milo", "Tess", "Kai", "June",
]
ANIMALS = [
    "fox", "rabbit", "bear", "mouse", "owl", "cat", "dog", "duck", "frog", "turtle", "squirrel",
    "hedgehog", "goat", "lamb", "robin", "otter",
]
ADJ = [
    "little", "brave", "shy", "happy", "curious", "sleepy", "kind", "clever", "tiny", "quiet",
    "funny", "gentle",
]
PLACES = [
    ("a quiet village", "the village"), ("a big forest", "the forest"),
    ("a small farm", "the farm"), ("a sunny meadow", "the meadow"),
    ("an old castle", "the castle"), ("a busy town", "the town"),
    ("a green valley", "the valley"), ("a house by the sea", "the house"),
    ("a garden full of flowers", "the garden"), ("a hill near the river", "the hill"),
]
COLORS = ["red", "blue", "yellow", "green", "purple", "orange", "white", "golden", "silver"]
OBJECTS = [
    "ball", "kite", "hat", "box", "key", "book", "cup", "drum", "boat", "lamp", "shell", "map",
    "bell", "scarf", "basket", "stone",
]
FOODS = ["apples", "bread", "soup", "berries", "carrots", "honey", "cake", "nuts", "pie", "cheese"]
FEELINGS = ["happy", "sad", "worried", "excited", "proud", "scared", "surprised", "tired"]
WEATHER = [
    "The sun was warm.", "It was raining a little.", "The wind was strong.", "Snow covered the ground.",
    "The sky was grey and still.", "It was a bright spring day.", "Leaves were falling from the trees.",
]
PROBLEMS = [
    ("lost", "could not find it anywhere"), ("broke", "it was in two pieces"),
    ("dropped", "it fell into the water"), ("forgot", "it was left far behind"),
]
TIMES = ["One morning", "One day", "That evening", "After lunch", "Later that week", "On a cold night"]
COUNT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _pron(r: random.Random) -> tuple[str, str, str]:
    return r.choice([("he", "him", "his"), ("she", "her", "her")])


def story(r: random.Random, number: int) -> str:
    hero, friend = r.sample(NAMES, 2)
    animal, friend_animal = r.choice(ANIMALS), r.choice(ANIMALS)
    adj = r.choice(ADJ)
    he, him, his = _pron(r)
    fhe, fhim, fhis = _pron(r)
    place, the_place = r.choice(PLACES)
    color, obj = r.choice(COLORS), r.choice(OBJECTS)
    food = r.choice(FOODS)
    verb, what_happened = r.choice(PROBLEMS)
    cap = lambda s: s[0].upper() + s[1:]  # noqa: E731

    lines = [f"Story {number}: {hero} and the {color.capitalize()} {obj.capitalize()}"]
    p = [
        f"Once upon a time, there was {_a(adj)} {animal} named {hero}.",
        f"{hero} lived in {place}.",
        r.choice(WEATHER),
        f"{cap(his)} best friend was {_a(friend_animal)} called {friend}.",
    ]
    if r.random() < 0.5:
        p.append(f"Every day, {hero} and {friend} ate {food} together.")
    lines.append(" ".join(p))

    p = [
        f"{r.choice(TIMES)}, {hero} found {_a(color)} {obj} near {the_place}.",
        f"{cap(he)} felt {r.choice(['happy', 'excited', 'surprised', 'proud'])}.",
        f'"Look, {friend}!" said {hero}. "I found {_a(color)} {obj}!"',
        f'{friend} smiled and said, "What a nice {obj}, {hero}."',
    ]
    lines.append(" ".join(p))

    p = [
        f"But then {hero} {verb} the {obj}, and {what_happened}.",
        f"{hero} was {r.choice(['sad', 'worried', 'scared'])}.",
        f'"Do not worry," said {friend}. "I will help you."',
    ]
    looks = [
        "They looked under a tree.", f"They walked to the edge of {the_place}.",
        f"They asked an old {r.choice(ANIMALS)} for help.", f"They counted to {COUNT_WORDS[r.randint(3, 10)]}.",
        "They searched behind a big rock.", f"{friend} climbed a hill to look around.",
    ]
    p.extend(r.sample(looks, r.randint(2, 4)))
    lines.append(" ".join(p))

    ending = r.choice([
        f"At last, {friend} found the {color} {obj} and gave it back to {hero}.",
        f"At last, {hero} saw the {color} {obj} shining in the grass.",
        f"In the end, {hero} and {friend} made a new {obj}, even better than the old one.",
    ])
    moral = r.choice([
        "Friends help each other.", "It is good to ask for help.", "Being patient is important.",
        "Sharing makes everyone happy.", "Never give up.",
    ])
    p = [
        ending,
        f'"Thank you, {friend}," said {hero}. "You are a good friend."',
        f"That night, {hero} went to sleep feeling {r.choice(['happy', 'proud', 'warm', 'safe'])}.",
        f"The moral of the story is: {moral}",
    ]
    lines.append(" ".join(p))
    return "\n\n".join(lines) + "\n\n"


def arithmetic(r: random.Random) -> str:
    out = ["Numbers:"]
    for _ in range(r.randint(4, 8)):
        a, b = r.randint(0, 20), r.randint(0, 20)
        op = r.choice(["+", "-", "*"])
        if op == "-" and b > a:
            a, b = b, a
        val = a + b if op == "+" else a - b if op == "-" else a * b
        out.append(f"{a} {op} {b} = {val}")
    return "\n".join(out) + "\n\n"


def shopping(r: random.Random) -> str:
    name = r.choice(NAMES)
    items = r.sample(FOODS, r.randint(3, 5))
    out = [f"{name}'s list:"]
    total = 0
    for it in items:
        n = r.randint(1, 9)
        total += n
        out.append(f"- {n} {it}")
    out.append(f"That is {total} things in all.")
    return "\n".join(out) + "\n\n"


def dialogue(r: random.Random) -> str:
    a, b = r.sample(NAMES, 2)
    food, obj, color = r.choice(FOODS), r.choice(OBJECTS), r.choice(COLORS)
    feel = r.choice(FEELINGS)
    return (
        f'{a}: "Hello, {b}. How are you today?"\n'
        f'{b}: "I am {feel}, {a}. I have {_a(color)} {obj}."\n'
        f'{a}: "Can I see your {color} {obj}?"\n'
        f'{b}: "Yes, {a}. And then we can eat some {food}."\n\n'
    )


def generate(seed: int = SEED, target_bytes: int = TARGET_BYTES) -> str:
    r = random.Random(seed)
    parts, size, number = [], 0, 1
    while size < target_bytes:
        u = r.random()
        if u < 0.70:
            s = story(r, number)
            number += 1
        elif u < 0.80:
            s = arithmetic(r)
        elif u < 0.90:
            s = shopping(r)
        else:
            s = dialogue(r)
        parts.append(s)
        size += len(s)
    return "".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="verify corpus.txt instead of writing it")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    text = generate().encode("ascii")
    if args.check:
        ok = args.out.exists() and args.out.read_bytes() == text
        print(f"{args.out}: {'matches' if ok else 'DIFFERS from'} the generator "
              f"(sha256 {hashlib.sha256(text).hexdigest()[:16]})")
        return 0 if ok else 1
    args.out.write_bytes(text)
    print(f"wrote {args.out} ({len(text)} bytes, sha256 {hashlib.sha256(text).hexdigest()[:16]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
