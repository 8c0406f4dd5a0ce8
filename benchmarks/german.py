"""A German text written by a seeded generator, for tokenizer benchmarks that must not download
anything: plain prose of everyday sentences with German's long compounds, umlauts and ß, case
endings and capitalised nouns. Not literature, but its spelling statistics are German's, which is
what tokenizers see.

    python benchmarks/german.py out.txt --bytes 1000000
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

# noun: (gender, plural); gender m/f/n decides the article
NOUNS = {
    "Mann": ("m", "Männer"),
    "Frau": ("f", "Frauen"),
    "Kind": ("n", "Kinder"),
    "Haus": ("n", "Häuser"),
    "Stadt": ("f", "Städte"),
    "Fluss": ("m", "Flüsse"),
    "Straße": ("f", "Straßen"),
    "Brücke": ("f", "Brücken"),
    "Zug": ("m", "Züge"),
    "Bahnhof": ("m", "Bahnhöfe"),
    "Garten": ("m", "Gärten"),
    "Baum": ("m", "Bäume"),
    "Blume": ("f", "Blumen"),
    "Buch": ("n", "Bücher"),
    "Brief": ("m", "Briefe"),
    "Tisch": ("m", "Tische"),
    "Fenster": ("n", "Fenster"),
    "Tür": ("f", "Türen"),
    "Schule": ("f", "Schulen"),
    "Lehrerin": ("f", "Lehrerinnen"),
    "Arzt": ("m", "Ärzte"),
    "Bäckerei": ("f", "Bäckereien"),
    "Brot": ("n", "Brote"),
    "Käse": ("m", "Käse"),
    "Apfel": ("m", "Äpfel"),
    "Wald": ("m", "Wälder"),
    "Berg": ("m", "Berge"),
    "See": ("m", "Seen"),
    "Wetter": ("n", "Wetter"),
    "Regen": ("m", "Regen"),
    "Sonne": ("f", "Sonnen"),
    "Winter": ("m", "Winter"),
    "Sommer": ("m", "Sommer"),
    "Nachbar": ("m", "Nachbarn"),
    "Freundin": ("f", "Freundinnen"),
    "Hund": ("m", "Hunde"),
    "Katze": ("f", "Katzen"),
    "Vogel": ("m", "Vögel"),
    "Auto": ("n", "Autos"),
    "Fahrrad": ("n", "Fahrräder"),
    "Zeitung": ("f", "Zeitungen"),
    "Regierung": ("f", "Regierungen"),
    "Versammlung": ("f", "Versammlungen"),
    "Gemeinde": ("f", "Gemeinden"),
    "Rathaus": ("n", "Rathäuser"),
    "Kirche": ("f", "Kirchen"),
    "Markt": ("m", "Märkte"),
    "Händler": ("m", "Händler"),
    "Mühle": ("f", "Mühlen"),
    "Schiff": ("n", "Schiffe"),
    "Hafen": ("m", "Häfen"),
    "Gesellschaft": ("f", "Gesellschaften"),
    "Entscheidung": ("f", "Entscheidungen"),
    "Frühstück": ("n", "Frühstücke"),
}
# parts of compounds: German writes them as one word (Donaudampfschifffahrt)
PARTS = [
    "Donau",
    "Dampf",
    "Schiff",
    "Fahrt",
    "Gesellschaft",
    "Kapitän",
    "Versicherung",
    "Bahn",
    "Hof",
    "Straßen",
    "Bau",
    "Amt",
    "Wetter",
    "Bericht",
    "Kinder",
    "Garten",
    "Schul",
    "Weg",
    "Rat",
    "Haus",
    "Meister",
    "Brücken",
    "Zoll",
    "Stadt",
    "Rand",
    "Gebiet",
    "Wald",
    "Wirtschaft",
    "Arbeit",
    "Zeit",
    "Gesetz",
    "Entwurf",
    "Müll",
    "Abfuhr",
    "Kalender",
    "Verkehrs",
    "Planung",
    "Ausschuss",
    "Vorsitz",
    "Übung",
    "Größe",
    "Maß",
    "Stab",
]
VERBS = [  # (3rd person singular, plural, takes an accusative object)
    ("sieht", "sehen", True),
    ("kauft", "kaufen", True),
    ("liest", "lesen", True),
    ("baut", "bauen", True),
    ("öffnet", "öffnen", True),
    ("schließt", "schließen", True),
    ("trägt", "tragen", True),
    ("findet", "finden", True),
    ("verlässt", "verlassen", True),
    ("erreicht", "erreichen", True),
    ("beobachtet", "beobachten", True),
    ("schläft", "schlafen", False),
    ("lacht", "lachen", False),
    ("wartet", "warten", False),
    ("läuft", "laufen", False),
    ("arbeitet", "arbeiten", False),
    ("träumt", "träumen", False),
    ("schweigt", "schweigen", False),
]
ADJECTIVES = [
    "alt",
    "neu",
    "groß",
    "klein",
    "schön",
    "müde",
    "fröhlich",
    "grün",
    "dunkel",
    "schwer",
    "höflich",
    "gemütlich",
    "übermäßig",
    "außergewöhnlich",
    "ruhig",
    "früh",
    "spät",
    "bekannt",
    "fremd",
    "süß",
]
ADVERBS = [
    "heute",
    "morgen",
    "gestern",
    "oft",
    "selten",
    "immer",
    "plötzlich",
    "langsam",
    "schnell",
    "gern",
    "natürlich",
    "übrigens",
    "trotzdem",
    "außerdem",
    "leider",
    "endlich",
    "draußen",
    "drüben",
]
PLACES = [
    "im Garten",
    "am Fluss",
    "in der Stadt",
    "auf dem Markt",
    "vor dem Rathaus",
    "hinter der Kirche",
    "über der Brücke",
    "unter dem Baum",
    "neben dem Bahnhof",
    "im Wald",
    "am Hafen",
    "in der Schule",
]
CONJUNCTIONS = ["weil", "obwohl", "während", "nachdem", "bevor", "damit", "sodass"]

NOMINATIVE = {"m": "der", "f": "die", "n": "das"}
ACCUSATIVE = {"m": "den", "f": "die", "n": "das"}
WEAK_ENDING = {"m": "e", "f": "e", "n": "e"}  # after the definite article: der alte, die alte, das alte
ACC_ENDING = {"m": "en", "f": "e", "n": "e"}  # den alten, die alte, das alte


def compound(rng: random.Random) -> tuple[str, str, str]:
    """A compound noun, its gender and plural (the last part's, as in German); 2-4 parts."""
    head = rng.choice(list(NOUNS))
    parts = [rng.choice(PARTS) for _ in range(rng.randint(1, 3))]
    stem = parts[0] + "".join(p.lower() for p in parts[1:])
    gender, plural = NOUNS[head]
    return stem + head.lower(), gender, stem + plural.lower()


def decline(adjective: str, ending: str) -> str:
    if adjective.endswith("el"):  # dunkel + e -> dunkle
        adjective = adjective[:-2] + "l"
    return adjective + (ending[1:] if adjective.endswith("e") else ending)  # müde + en -> müden


def noun_phrase(rng: random.Random, case: str) -> tuple[str, bool]:
    """(phrase, plural?) in nominative or accusative."""
    if rng.random() < 0.25:
        noun, gender, plural_form = compound(rng)
    else:
        noun = rng.choice(list(NOUNS))
        gender, plural_form = NOUNS[noun]
    plural = rng.random() < 0.3
    adjective = rng.choice(ADJECTIVES) if rng.random() < 0.5 else None
    if plural:
        return "die " + (decline(adjective, "en") + " " if adjective else "") + plural_form, True
    article = (NOMINATIVE if case == "nom" else ACCUSATIVE)[gender]
    ending = (WEAK_ENDING if case == "nom" else ACC_ENDING)[gender]
    return f"{article} " + (decline(adjective, ending) + " " if adjective else "") + noun, False


def clause(rng: random.Random, subordinate: bool = False) -> str:
    """Subject, verb, [adverb], [object], [place]; a subordinate clause puts its verb last."""
    subject, plural = noun_phrase(rng, "nom")
    singular, plural_verb, transitive = rng.choice(VERBS)
    rest = [rng.choice(ADVERBS)] * (rng.random() < 0.4)
    if transitive:
        rest.append(noun_phrase(rng, "acc")[0])
    rest += [rng.choice(PLACES)] * (rng.random() < 0.4)
    verb = plural_verb if plural else singular
    return " ".join([subject, *rest, verb] if subordinate else [subject, verb, *rest])


def sentence(rng: random.Random) -> str:
    text = clause(rng)
    if rng.random() < 0.3:
        text += f", {rng.choice(CONJUNCTIONS)} {clause(rng, subordinate=True)}"
    end = rng.choice([".", ".", ".", "!", "?"])
    return text[0].upper() + text[1:] + end


def german_text(n_bytes: int, seed: int = 0) -> str:
    """Paragraphs of 3-8 sentences, blank lines between them, about n_bytes of UTF-8."""
    rng = random.Random(seed)
    paragraphs, size = [], 0
    while size < n_bytes:
        paragraph = " ".join(sentence(rng) for _ in range(rng.randint(3, 8)))
        paragraphs.append(paragraph)
        size += len(paragraph.encode("utf-8")) + 2
    return "\n\n".join(paragraphs) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--bytes", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.write_text(german_text(args.bytes, args.seed), encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
