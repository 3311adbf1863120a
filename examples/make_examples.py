"""Write the example data sets of examples/ (run from the repository root:
`python examples/make_examples.py`; the files it writes are shipped, this script says
how they were made). Everything here is made up from the word lists below, seeded, so
the files come out the same on every run; nothing is downloaded.

sentiment/  short film reviews, {"sentence", "label"} (1 positive, 0 negative), for the
            classification task with label words: each sentence ends with a judging
            word (plain or after an intensifier) whose polarity is the label, sometimes
            after a clause of the other polarity joined by "but" (the last judgement
            counts); train.jsonl (320 lines) and test.jsonl (120 held-out lines: the
            same words, other sentences).
sentiment-short/  the same format, short and plain: 2 to 5 words ending with one of 4
            positive or 4 negative judging words ("the plot felt dull", "so charming");
            train.jsonl (320 lines), test.jsonl (120 other sentences). A micro model with
            random weights already tells these apart in the last hidden state of
            "{sentence} It was" (a linear probe on it: 0.88 to 0.97 held-out, model seeds
            0-3), so 600 MeZO steps usually lift held-out accuracy from 0.5 to 0.8-1.0
            (tests/integration/test_accuracy.py, scripts/demo.sh); on the long reviews of
            sentiment/ such a model stays near chance (probe: 0.60).
completion/ {"prompt", "completion"}: the opposite of a word, for the
            prompt/completion task; train.jsonl (48 lines), test.jsonl (16).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUBJECTS = ("the movie", "the film", "the acting", "the plot", "the music", "the ending",
            "the cast", "the story", "the script", "the dialogue", "the camera work",
            "the soundtrack", "the lead actor", "the second half", "the opening scene")
VERBS = ("was", "felt", "seemed", "looked", "sounded", "turned out")
INTENSIFIERS = ("", "", "really", "truly", "quite", "very", "rather", "so")
OPENERS = ("", "", "", "honestly ,", "i thought", "in the end", "to me", "overall ,")
POSITIVE = ("wonderful", "brilliant", "charming", "delightful", "moving", "clever", "superb",
            "beautiful", "funny", "gripping", "fresh", "lovely", "smart", "warm", "stunning")
NEGATIVE = ("awful", "dull", "clumsy", "tedious", "bland", "boring", "messy", "painful",
            "lifeless", "weak", "silly", "flat", "tired", "ugly", "dreadful")
SHORT_POSITIVE, SHORT_NEGATIVE = POSITIVE[:4], NEGATIVE[:4]
SHORT_FORMS = ("{a}", "so {a}", "very {a}", "really {a}", "{s} was {a}", "{s} felt {a}",
               "{s} seemed {a}", "{s} , {a}")
LABEL_WORDS = {"0": " terrible", "1": " great"}   # the template's candidates (README)
TEMPLATE = "{sentence} It was"

OPPOSITES = (("hot", "cold"), ("up", "down"), ("big", "small"), ("fast", "slow"),
             ("open", "closed"), ("early", "late"), ("light", "dark"), ("old", "new"),
             ("happy", "sad"), ("high", "low"), ("full", "empty"), ("hard", "soft"),
             ("wet", "dry"), ("strong", "weak"), ("rich", "poor"), ("near", "far"),
             ("long", "short"), ("loud", "quiet"), ("thick", "thin"), ("clean", "dirty"),
             ("first", "last"), ("left", "right"), ("inside", "outside"), ("win", "lose"),
             ("buy", "sell"), ("push", "pull"), ("give", "take"), ("true", "false"),
             ("day", "night"), ("yes", "no"), ("begin", "end"), ("above", "below"))
QUESTIONS = ("what is the opposite of {w} ?", "the opposite of {w} is", "{w} , opposite :",
             "name the opposite of {w} .")


def _clause(rng: random.Random, words: tuple[str, ...]) -> str:
    parts = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(INTENSIFIERS), rng.choice(words)]
    return " ".join(p for p in parts if p)


def review(rng: random.Random, label: int) -> str:
    """One sentence whose last judging word has the label's polarity."""
    mine, other = (POSITIVE, NEGATIVE) if label else (NEGATIVE, POSITIVE)
    last = _clause(rng, mine)
    if rng.random() < 0.25:
        last = f"{_clause(rng, other)} but {last}"
    opener = rng.choice(OPENERS)
    return f"{opener} {last}".strip()


def short_review(rng: random.Random, label: int) -> str:
    """A few words ending with a judging word of the label's polarity."""
    word = rng.choice(SHORT_POSITIVE if label else SHORT_NEGATIVE)
    return rng.choice(SHORT_FORMS).format(a=word, s=rng.choice(SUBJECTS))


def sentiment(rng: random.Random, count: int, seen: set[str], make=review) -> list[dict]:
    """`count` distinct sentences of `make` (none in `seen`), labels alternating in a
    shuffled order."""
    out = []
    labels = [i % 2 for i in range(count)]
    rng.shuffle(labels)
    for label in labels:
        while True:
            sentence = make(rng, label)
            if sentence not in seen:
                break
        seen.add(sentence)
        out.append({"sentence": sentence, "label": label})
    return out


def completions(rng: random.Random) -> tuple[list[dict], list[dict]]:
    pairs = [*OPPOSITES, *[(b, a) for a, b in OPPOSITES]]
    rng.shuffle(pairs)
    rows = [{"prompt": rng.choice(QUESTIONS).format(w=a), "completion": f" {b}"} for a, b in pairs]
    return rows[:48], rows[48:]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    rng = random.Random(14)
    seen: set[str] = set()
    write_jsonl(HERE / "sentiment" / "train.jsonl", sentiment(rng, 320, seen))
    write_jsonl(HERE / "sentiment" / "test.jsonl", sentiment(rng, 120, seen))
    train, test = completions(rng)
    write_jsonl(HERE / "completion" / "train.jsonl", train)
    write_jsonl(HERE / "completion" / "test.jsonl", test)
    rng, seen = random.Random(15), set()
    write_jsonl(HERE / "sentiment-short" / "train.jsonl", sentiment(rng, 320, seen, short_review))
    write_jsonl(HERE / "sentiment-short" / "test.jsonl", sentiment(rng, 120, seen, short_review))


if __name__ == "__main__":
    main()
