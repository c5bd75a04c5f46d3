"""The second check a semantic-cache hit must pass before it is served: two texts that embed
close together must also agree on every detail that changes the answer.

A sentence encoder scores "turn on the kitchen lights" and "turn off the kitchen lights" at
0.90, above any threshold that still lets fresh paraphrases through, so no threshold alone
separates them. ``disagreement`` compares what the embedding blurs: numbers (digits and
number words), negation, antonym pairs, units, dates, and entities (identifiers, quoted text,
names written with a capital). It errs towards "they differ": a paraphrase it refuses is a
miss (the model answers), a near-miss it let through would be a wrong answer. No Django here.
"""

from __future__ import annotations

import json
import re

_WORD = re.compile(r"[a-z0-9]+(?:['.][a-z0-9]+)*", re.I)
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:[.,]\d+)*(?![\w])|\d+(?=[a-z%°$€£])", re.I)
_IDENTIFIER = re.compile(r"[\w.@/:-]*\d[\w.@/:-]*|[\w.-]+[_/@][\w./@-]+", re.I)
_QUOTED = re.compile(r"\"([^\"]{1,80})\"|(?<![A-Za-z])'([^']{2,80})'(?![A-Za-z])")
# a number with a short suffix ("5th", "3pm", "10km", "20%"): the numbers, units and dates
# checks compare those, an entity is something else ("web-2", "INV-1042", "v2.3")
_MEASURE = re.compile(r"[-+]?[\d.,]+(?:st|nd|rd|th|a\.?m\.?|p\.?m\.?|[a-z%°$€£]{1,3})?")
_CAPITALISED = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-zA-Z]+")

NUMBER_WORDS = {
    "zero": 0, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000,
    "million": 1e6, "billion": 1e9, "dozen": 12, "half": 0.5, "twice": 2,
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5,
    "double": 2, "triple": 3, 
}  # fmt: skip
NEGATIONS = {
    "not", "no", "never", "without", "none", "nobody", "nothing", "neither", "nor", "cannot",
    "except", "excluding", "non", "unless", "n't", "dont", "doesnt", "isnt", "arent", "wont",
    "cant", "didnt", "shouldnt", "wasnt", "werent", "havent", "hasnt", "free",
}  # fmt: skip
ANTONYMS = [
    ("on", "off"), ("enable", "disable"), ("open", "close"), ("increase", "decrease"),
    ("add", "remove"), ("start", "stop"), ("buy", "sell"), ("upload", "download"),
    ("lock", "unlock"), ("max", "min"), ("maximum", "minimum"), ("ascending", "descending"),
    ("first", "last"), ("before", "after"), ("import", "export"), ("include", "exclude"),
    ("always", "never"), ("up", "down"), ("above", "below"), ("more", "less"),
    ("higher", "lower"), ("highest", "lowest"), ("allow", "deny"), ("accept", "reject"),
    ("push", "pull"), ("true", "false"), ("yes", "no"), ("plus", "minus"), ("north", "south"),
    ("east", "west"), ("left", "right"), ("input", "output"), ("inbound", "outbound"),
    ("send", "receive"), ("connect", "disconnect"), ("mount", "unmount"),
    ("install", "uninstall"), ("subscribe", "unsubscribe"), ("show", "hide"),
    ("expand", "collapse"), ("encrypt", "decrypt"), ("compress", "decompress"),
    ("hot", "cold"), ("old", "new"), ("oldest", "newest"), ("earliest", "latest"),
    ("early", "late"), ("cheap", "expensive"), ("cheapest", "priciest"), ("fast", "slow"),
    ("fastest", "slowest"), ("small", "large"), ("smallest", "largest"), ("big", "small"),
    ("start", "end"), ("begin", "end"), ("arrive", "depart"), ("arrival", "departure"),
    ("win", "lose"), ("gain", "loss"), ("profit", "loss"), ("debit", "credit"),
    ("credit", "debit"), ("grant", "revoke"), ("approve", "reject"), ("join", "leave"),
    ("attach", "detach"), ("freeze", "unfreeze"), ("pause", "resume"), ("mute", "unmute"),
    ("raise", "lower"), ("warm", "cool"), ("heat", "cool"), ("inside", "outside"),
    ("public", "private"),
    ("internal", "external"), ("success", "failure"), ("succeeded", "failed"),
    ("online", "offline"), ("asc", "desc"), ("next", "previous"), ("next", "last"),
    ("high", "low"), ("gain", "lost"), ("gained", "lost"), ("gainers", "losers"),
    ("rise", "fall"), ("rose", "fell"), ("winners", "losers"), ("paid", "unpaid"),
    ("this", "next"), ("this", "last"), ("add", "delete"), ("create", "delete"),
    ("success", "error"), ("upgrade", "downgrade"), ("activate", "deactivate"),
    ("warmer", "colder"), ("warm", "cold"), ("under", "over"), ("best", "worst"),
    ("better", "worse"), ("richest", "poorest"), ("rich", "poor"), ("sell", "keep"),
    ("buy", "keep"), ("hotter", "colder"), ("cheaper", "pricier"), ("bigger", "smaller"),
    ("faster", "slower"), ("longer", "shorter"), ("longest", "shortest"), ("most", "least"),
    ("wettest", "driest"), ("safest", "riskiest"), ("safe", "unsafe"),
]  # fmt: skip
UNITS = {
    "celsius": "C", "°c": "C", "centigrade": "C", "fahrenheit": "F", "°f": "F",
    "kelvin": "K", "km": "km", "kilometer": "km", "kilometers": "km", "kilometre": "km",
    "kilometres": "km", "mile": "mi", "miles": "mi", "mi": "mi", "meter": "m", "meters": "m",
    "metre": "m", "metres": "m", "m": "m", "feet": "ft", "foot": "ft", "ft": "ft",
    "inch": "in", "inches": "in", "cm": "cm", "mm": "mm", "kg": "kg", "kilogram": "kg",
    "kilograms": "kg", "kilo": "kg", "kilos": "kg", "lb": "lb", "lbs": "lb", "pound": "lb",
    "pounds": "lb", "g": "g", "gram": "g", "grams": "g", "oz": "oz", "ounce": "oz",
    "ounces": "oz", "usd": "USD", "$": "USD", "dollar": "USD", "dollars": "USD",
    "eur": "EUR", "€": "EUR", "euro": "EUR", "euros": "EUR", "gbp": "GBP", "£": "GBP",
    "sterling": "GBP", "jpy": "JPY", "yen": "JPY", "chf": "CHF", "gb": "GB", "gib": "GiB",
    "mb": "MB", "mib": "MiB", "tb": "TB", "tib": "TiB", "kb": "kB", "kib": "KiB",
    "c": "C", "f": "F", "hour": "h", "hours": "h", "hr": "h", "hrs": "h", "h": "h", "minute": "min",
    "minutes": "min", "min": "min", "mins": "min", "second": "s", "seconds": "s", "sec": "s",
    "secs": "s", "ms": "ms", "millisecond": "ms", "milliseconds": "ms", "day": "d",
    "days": "d", "week": "w", "weeks": "w", "month": "mo", "months": "mo", "year": "y",
    "years": "y", "metric": "metric", "imperial": "imperial", "liter": "l", "liters": "l",
    "litre": "l", "litres": "l", "gallon": "gal", "gallons": "gal", "percent": "%", "%": "%",
    "mph": "mph", "kph": "kph", "kmh": "kph",
}  # fmt: skip
DATES = {
    "jan": "m1", "january": "m1", "feb": "m2", "february": "m2", "mar": "m3", "march": "m3",
    "apr": "m4", "april": "m4", "jun": "m6", "june": "m6", "jul": "m7",
    "july": "m7", "aug": "m8", "august": "m8", "sep": "m9", "sept": "m9", "september": "m9",
    "oct": "m10", "october": "m10", "nov": "m11", "november": "m11", "dec": "m12",
    "december": "m12", "mon": "d1", "monday": "d1", "tue": "d2", "tues": "d2",
    "tuesday": "d2", "wed": "d3", "wednesday": "d3", "thu": "d4", "thurs": "d4",
    "thursday": "d4", "fri": "d5", "friday": "d5", "sat": "d6", "saturday": "d6",
    "sun": "d7", "sunday": "d7", "today": "r0", "tonight": "t-night", "tomorrow": "r+1",
    "yesterday": "r-1", "weekend": "we", "weekday": "wd", "q1": "q1", "q2": "q2",
    "q3": "q3", "q4": "q4", "morning": "t-am", "afternoon": "t-pm", "evening": "t-night",
    "night": "t-night", "noon": "t-noon", "midnight": "t-midnight", "daily": "every-d", "weekly": "every-w", "monthly": "every-mo",
    "yearly": "every-y", "annual": "every-y", "annually": "every-y", "hourly": "every-h",
}  # fmt: skip


def words(text: str) -> list[str]:
    """Lower-case words (contractions kept: "don't"; a possessive's "'s" dropped)."""
    found = [w.lower() for w in _WORD.findall(text.replace("\u2019", "'"))]
    return [w[:-2] if w.endswith("'s") else w for w in found]


def numbers(text: str) -> set[str]:
    """Every number the text says, as digits ("three" and "3" are one number)."""
    found = set()
    for raw in _NUMBER.findall(text):
        cleaned = raw.replace(",", "").lstrip("+")
        try:
            found.add(f"{float(cleaned):g}")
        except ValueError:
            found.add(cleaned)
    for word in words(text):
        value = NUMBER_WORDS.get(word)
        if value is not None:
            found.add(f"{float(value):g}")
        if re.fullmatch(r"\d+(st|nd|rd|th)", word):  # "May 5th" and "May 5" are one day
            found.add(f"{int(word[:-2])}")
    return found


def negated(text: str) -> bool:
    """Whether the text says "not" an odd number of times ("not without" is a yes)."""
    cues = 0
    for word in words(text):
        if word in NEGATIONS or word.endswith("n't"):
            cues += 1
    return cues % 2 == 1


NEGATING_PREFIXES = ("un", "non", "in", "im", "il", "ir", "dis", "de")


def negated_word(a: str, b: str) -> str:
    """A word of one text whose negation by prefix is a word of the other ("paid" /
    "unpaid", "available" / "unavailable"), else ""."""
    left, right = set(words(a)), set(words(b))
    for one, other in ((left, right), (right, left)):
        for word in one:
            for prefix in NEGATING_PREFIXES:
                if len(word) > 2 and (prefix + word) in other and (prefix + word) not in one:
                    return f"{word} / {prefix}{word}"
    return ""


def opposed(a: str, b: str) -> list[tuple[str, str]]:
    """The ``ANTONYMS`` pairs where one text says one word and the other its opposite (a
    text that says neither, or both, opposes nothing: "meeting on May 5" and "meeting May 5"
    agree)."""
    left, right = set(words(a)), set(words(b))
    found = []
    for x, y in ANTONYMS:
        lx, ly, rx, ry = (_says(t, w) for t, w in ((left, x), (left, y), (right, x), (right, y)))
        if (lx and not ly and ry and not rx) or (ly and not lx and rx and not ry):
            found.append((x, y))
    return found


def _says(said: set[str], word: str) -> bool:
    """``word`` or, for words of four letters and more, an inflection of it ("enabled")."""
    if word in said:
        return True
    return len(word) >= 4 and any(w.startswith(word) and len(w) - len(word) <= 3 for w in said)


# a unit named on its own says what is asked ("in celsius", "price in EUR"); a unit word that
# is also everyday speech ("time of year", "a day") counts only right after a number
STRONG_UNITS = {"C", "F", "K", "USD", "EUR", "GBP", "JPY", "CHF", "GiB", "MiB", "TiB", "KiB"}
STRONG_UNITS |= {"metric", "imperial", "mph", "kph", "km", "mi", "kg", "lb", "GB", "MB", "TB", "%"}
_AFTER_NUMBER = re.compile(
    r"(?:\d[\d.,]*|\b(?:two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
    r"fifteen|twenty|thirty|forty|fifty|sixty|ninety|hundred)\b)\s*([a-z°%$€£]+)",
    re.I,
)


def units(text: str) -> set[str]:
    lowered = text.lower()
    found = {UNITS[w] for w in words(lowered) if w in UNITS and UNITS[w] in STRONG_UNITS}
    found |= {UNITS[u] for u in _AFTER_NUMBER.findall(lowered) if u in UNITS}
    found |= {UNITS[w] for w in _BARE_UNIT.findall(lowered) if w in UNITS}
    found |= {UNITS[s] for s in ("$", "€", "£", "°c", "°f", "%") if s in lowered}
    return found


_BARE_UNIT = re.compile(r"\d\s*(c|f)\b", re.I)


_MAY = re.compile(
    r"\bMay\s+\d|\d+(?:st|nd|rd|th)?\s+(?:of\s+)?May\b|\b(?:in|of|since|until)\s+May\b", re.I
)
_CLOCK = re.compile(r"\d\s*(a\.?m|p\.?m)\b", re.I)


_RELATIVE = {"this", "next", "last", "previous", "coming", "past"}
_PERIODS = {"week", "weekend", "month", "year", "quarter", "season", "semester", "sprint"}


def dates(text: str) -> set[str]:
    """Months, weekdays, relative days, quarters, times of day ("May" only where it is the
    month: next to a day's number or after "in", "of" ...; am/pm only after a time)."""
    said = words(text)
    found = {DATES.get(w) or DATES.get(w[:-1]) for w in said} - {None}  # "sundays": a day
    for qualifier, noun in zip(said, said[1:], strict=False):
        if qualifier in _RELATIVE and (noun in _PERIODS or noun in DATES):
            found.add(f"{qualifier} {noun}")  # "this weekend", "next month", "last year"
    if _MAY.search(text):
        found.add("m5")
    found |= {"t-" + m.lower().replace(".", "")[:2] for m in _CLOCK.findall(text)}
    return found


def entities(text: str) -> set[str]:
    """Identifiers (anything with a digit, ``_``, ``/``, ``@``), quoted text and words written
    with a capital inside a sentence, lower-cased."""
    found = {m.lower() for m in _IDENTIFIER.findall(text)}
    found |= {(a or b).strip().lower() for a, b in _QUOTED.findall(text)}
    found |= {m.lower() for m in _CAPITALISED.findall(text)}
    named_elsewhere = set(DATES) | set(UNITS)  # the dates and units checks compare those
    return {
        f
        for f in found
        if f
        and not _MEASURE.fullmatch(f)
        and f not in named_elsewhere
        and f.rstrip("s") not in named_elsewhere
    }


def _entity_gap(a: str, b: str) -> set[str]:
    """Entities of one text that the other does not contain as words (case aside)."""
    a_words, b_words = " ".join(words(a)), " ".join(words(b))
    missing = set()
    for entity, other in ((e, b_words) for e in entities(a)):
        if " ".join(words(entity)) not in other:
            missing.add(entity)
    for entity, other in ((e, a_words) for e in entities(b)):
        if " ".join(words(entity)) not in other:
            missing.add(entity)
    return missing


STOPWORDS = {
    "a", "an", "the", "is", "are", "was", "be", "to", "of", "in", "on", "for", "at", "by",
    "with", "and", "or", "my", "me", "i", "you", "your", "it", "its", "this", "that", "do",
    "does", "can", "could", "would", "please", "what", "how", "which", "who", "when", "where",
    "may", "might", "should", "will", "shall", "must", "kindly", "pls", "whats", "tell", "show",
    "give", "get", "find", "need", "want", "some", "any", "all", "there", "here", "just",
}  # fmt: skip


def substituted(a: str, b: str) -> str:
    """The one word (or two in a row) that ``b`` puts in the place of ``a``'s, everything
    else said alike and in the same order ("living room" / "dining room", "staging" /
    "production"): a near-miss of another thing of the same kind, which nothing above names.
    A paraphrase says more than one word differently, or says them elsewhere."""
    left, right = words(a), words(b)
    if len(left) != len(right) or left == right:
        return ""
    changed = [i for i, (x, y) in enumerate(zip(left, right, strict=True)) if x != y]
    if changed[-1] - changed[0] > 1:
        return ""
    swapped = [
        (left[i], right[i])
        for i in changed
        if left[i] not in STOPWORDS and right[i] not in STOPWORDS
    ]
    return " ".join(f"{x} / {y}" for x, y in swapped)


def tool_call(text: str) -> tuple[str, object] | None:
    """``(name, arguments)`` of a tool call written ``name {json}``, else None."""
    name, _, rest = text.strip().partition(" ")
    if not rest.startswith("{") or not name.replace("_", "").replace(".", "").isalnum():
        return None
    try:
        return name, json.loads(rest)
    except ValueError:
        return None


def compared_text(text: str) -> str:
    """What the encoder compares: for a tool call (``name {json}``) its argument values as
    ``key: value`` lines (the tool is the namespace already, and JSON's braces and quotes,
    shared by every call, would lift two unrelated calls' similarity above any threshold:
    ``search_web`` for "hotels in Rome without free parking" scored 0.79 against "cheap
    flights to Rome"); any other text as it is."""
    call = tool_call(text)
    if call is None:
        return text
    lines: list[str] = []
    _leaves(call[1], "", lines)
    return "\n".join(lines) or text


def _leaves(value: object, where: str, lines: list[str]) -> None:
    if isinstance(value, dict):
        for key in sorted(value):
            _leaves(value[key], f"{where}.{key}" if where else str(key), lines)
    elif isinstance(value, list):
        for item in value:
            _leaves(item, where, lines)
    else:
        lines.append(f"{where}: {value}" if where else str(value))


def _arguments_disagree(left: object, right: object, where: str = "") -> str:
    """Tool arguments agree when they have the same keys, equal non-text values and text
    values that ``disagreement`` lets through."""
    if isinstance(left, dict) and isinstance(right, dict):
        if set(left) != set(right):
            return f"arguments differ: {sorted(set(left) ^ set(right))}"
        for key in sorted(left):
            why = _arguments_disagree(left[key], right[key], f"{where}{key}.")
            if why:
                return why
        return ""
    if isinstance(left, str) and isinstance(right, str):
        if left != right and not (_natural_case(left) and _natural_case(right)):
            # "xYzAbC" / "XyZaBc": a token or a key, where case is part of the value
            return f"{where.rstrip('.')}: {left!r} / {right!r} (case)"
        if " " not in left.strip() or " " not in right.strip():  # a path, an id, a code
            # letters only (a city, a currency code) are one value in any case; a path, a
            # hash or an id (digits, "/", ".", "_") only as written
            same = left == right or (left.isalpha() and left.lower() == right.lower())
            return "" if same else f"{where.rstrip('.')}: {left!r} / {right!r}"
        why = disagreement(left, right) if left.lower() != right.lower() else ""
        return f"{where.rstrip('.')}: {why}" if why else ""
    if isinstance(left, bool) != isinstance(right, bool):
        return f"{where.rstrip('.')}: {left!r} / {right!r}"
    if left == right or (_scalar(left) and _scalar(right) and str(left) == str(right)):
        return ""  # "2" and 2: one value written two ways
    return f"{where.rstrip('.')}: {left!r} / {right!r}"


def _natural_case(text: str) -> bool:
    """Written as words are: all lower, all upper, or each word capitalised ("Paris",
    "New York", "USD"); mixed case inside a word ("xYzAbC", "camelCase") is not."""
    return all(w.islower() or w.isupper() or w.istitle() or not w.isalpha() for w in text.split())


def _scalar(value: object) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


_OPERATOR = re.compile(
    r"(?:\b\d+(?:\.\d+)?|\b[a-z]\b)\s*(<=|>=|!=|==|[-+*/<>=^])\s*(?=\d|\b[a-z]\b)", re.I
)
_LATIN = re.compile(r"[^\W\d_]", re.UNICODE)


def operators(text: str) -> list[str]:
    """The arithmetic and comparison operators written between numbers or words."""
    return sorted(_OPERATOR.findall(text))


def unchecked_script(text: str) -> bool:
    """Whether the text is mostly letters these checks cannot read (not Latin): nothing in
    it could be compared, so it is never taken for another text."""
    letters = _LATIN.findall(text)
    latin = sum(1 for c in letters if c.isascii() or "\u00c0" <= c <= "\u024f")
    return bool(letters) and latin < 0.8 * len(letters)


def reordered(a: str, b: str) -> bool:
    """The same words in another order ("from Paris to London" / "from London to Paris",
    "my dog bit the neighbour" / "the neighbour bit my dog")."""
    left, right = words(a), words(b)
    return left != right and sorted(left) == sorted(right)


def disagreement(a: str, b: str) -> str:
    """Why ``b`` must not be served ``a``'s cached answer ("" when nothing checked differs):
    numbers, negation, antonyms, units, dates, operators, word order or entities, named with
    what differs. Tool calls (``name {json}``) agree when their names are equal and their
    arguments do. Text in a script the checks cannot read agrees only with itself."""
    calls = tool_call(a), tool_call(b)
    if calls[0] is not None and calls[1] is not None:
        if calls[0][0] != calls[1][0]:
            return f"another tool: {calls[0][0]} / {calls[1][0]}"
        return _arguments_disagree(calls[0][1], calls[1][1])
    if (unchecked_script(a) or unchecked_script(b)) and a.strip().lower() != b.strip().lower():
        return "a script these checks cannot read"
    if operators(a) != operators(b):
        return f"operators differ: {operators(a)} / {operators(b)}"
    if reordered(a, b):
        return "the same words in another order"
    checks = (("numbers", numbers), ("units", units), ("dates", dates))
    for name, extract in checks:
        left, right = extract(a), extract(b)
        if left != right:
            return f"{name} differ: {sorted(left ^ right)}"
    opposite = opposed(a, b)
    if opposite:
        return f"opposites: {opposite[0][0]} / {opposite[0][1]}"
    if negated(a) != negated(b):
        return "one is negated"
    prefixed = negated_word(a, b)
    if prefixed:
        return f"one is negated: {prefixed}"
    gap = _entity_gap(a, b)
    if gap:
        return f"entities differ: {sorted(gap)}"
    swap = substituted(a, b)
    return f"substituted: {swap}" if swap else ""
