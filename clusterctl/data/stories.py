"""The embedded corpus: short, seeded children's stories, so training works with no download at all.

Story k of seed s is a pure function of (s, k) (`story(s, k)`), so a rank can generate only its own
documents. The stories have the structure a tiny language model picks up within a few hundred steps:
a small vocabulary of characters, places and objects, a fixed arc (meet, want, problem, three tries,
resolution, moral), dialogue in quotes, and pronouns that agree with the character.

Why a generated corpus rather than a downloaded one: docs/facts/data.md#no-network-at-run-time.
"""
from __future__ import annotations

import random

# About 940 bytes per story: 4,000 stories are ~3.8 MB of text, ~3.8M byte-level tokens, which a batch
# of 8 x 256 takes ~1,800 steps to see once at world 1 (and generates in ~0.1 s).
DEFAULT_STORIES = 4000

NAMES = [("Lily", "she"), ("Tom", "he"), ("Mia", "she"), ("Ben", "he"), ("Sue", "she"), ("Max", "he"),
         ("Anna", "she"), ("Sam", "he"), ("Lucy", "she"), ("Jack", "he"), ("Emma", "she"), ("Leo", "he"),
         ("Zoe", "she"), ("Tim", "he"), ("Ella", "she"), ("Finn", "he"), ("Rosa", "she"), ("Omar", "he")]
KINDS = ["girl", "boy", "cat", "dog", "bunny", "bear", "bird", "fox", "frog", "mouse", "duck", "puppy"]
ADJECTIVES = ["little", "happy", "brave", "curious", "shy", "kind", "silly", "clever", "small", "friendly"]
PLACES = [("a small house", "garden"), ("a big forest", "old tree"), ("a quiet farm", "red barn"),
          ("a sunny town", "park"), ("a green hill", "pond"), ("a busy city", "library"),
          ("a cozy village", "bakery"), ("a sandy beach", "big rock")]
RELATIVES = ["mom", "dad", "grandma", "grandpa", "big sister", "little brother"]
ACTIVITIES = ["play with a ball", "draw pictures", "sing songs", "look at the clouds", "pick flowers",
              "build with blocks", "read books", "jump in puddles", "chase butterflies", "dance"]
OBJECTS = ["ball", "kite", "hat", "box", "key", "shell", "cup", "drum", "boat", "book", "star", "sock"]
COLOURS = ["red", "blue", "yellow", "green", "shiny", "purple", "orange", "tiny", "golden", "soft"]
PROBLEMS = [("stuck in a tree", "climbed up slowly and got it down"),
            ("broken", "fixed it with glue and tape"),
            ("very dirty", "washed it with soap and water"),
            ("lost in the tall grass", "looked and looked until they found it"),
            ("too heavy to carry", "pushed it together, one step at a time"),
            ("wet from the rain", "put it in the sun to dry")]
HELPERS = ["the wise owl", "the old turtle", "a busy ant", "the farmer", "a tall giraffe", "the baker",
           "a little fish", "the mail carrier"]
REPLIES = ["I do not know, but you can ask {h}.", "I am too busy now. Ask {h}.", "Maybe {h} can help you."]
FEELINGS = ["happy", "proud", "glad", "excited", "thankful"]
MORALS = ["friends help each other", "it is good to share", "you should never give up",
          "asking for help is brave", "working together makes things easy", "being kind makes everyone happy"]
SAY = ["said", "asked", "shouted", "whispered", "cried"]

PRONOUNS = {"she": ("she", "her", "her"), "he": ("he", "him", "his")}


def story(seed: int, k: int) -> str:
    """Story `k` of the corpus seeded `seed`."""
    # A string seed is hashed with SHA-512 by `random`, the same on every Python and every host.
    rng = random.Random(f"clusterctl-stories:{seed}:{k}")
    c = rng.choice
    (name, gender), (friend, fgender) = rng.sample(NAMES, 2)
    he, him, his = PRONOUNS[gender]
    fhe = PRONOUNS[fgender][0]
    kind, fkind = c(KINDS), c(KINDS)
    place, spot = c(PLACES)
    thing = f"{c(COLOURS)} {c(OBJECTS)}"
    problem, fix = c(PROBLEMS)
    helpers = rng.sample(HELPERS, 3)
    feeling = c(FEELINGS)
    out = [
        c([f"Once upon a time, there was a {c(ADJECTIVES)} {kind} named {name}.",
           f"{name} was a {c(ADJECTIVES)} {kind}.",
           f"There once was a {c(ADJECTIVES)} {kind} called {name}."]),
        f"{he.capitalize()} lived in {place} with {his} {c(RELATIVES)}.",
        f"Every day, {name} liked to {c(ACTIVITIES)} near the {spot}.",
        f"One day, {name} found a {thing} by the {spot}, but the {thing.split()[1]} was {problem}.",
        f'"Oh no!" {c(SAY)} {name}. "What can I do?"',
        f"{name} had a friend, a {fkind} named {friend}.",
        f'"Do not be sad," said {friend}. "We can find help together."',
    ]
    # The three tries repeat one pattern, so the model sees the same shape three times per story.
    for i, helper in enumerate(helpers):
        step = ["First", "Then", "At last"][i]
        out.append(f'{step}, they went to {helper}. "Can you help us?" {c(SAY)} {name}.')
        if i < 2:
            out.append(f'{helper.capitalize()} said, "{c(REPLIES).format(h=helpers[i + 1])}"')
        else:
            out.append(f'{helper.capitalize()} smiled and said, "Yes, I can help you."')
    out += [
        f"So {name}, {friend} and {helpers[2]} {fix}.",
        f'"Thank you!" said {name}. {he.capitalize()} felt very {feeling}.',
        f"{friend} was {feeling} too, and {fhe} gave {name} a big hug.",
        f"That day, {name} learned that {c(MORALS)}. The end.",
    ]
    return " ".join(out)
