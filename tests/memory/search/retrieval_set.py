"""A labelled retrieval set for memory search (issue 21): facts in two namespaces and
questions of five kinds, each with the facts that answer it.

Kinds:
- `paraphrase`: the question shares (almost) no word with its fact;
- `name`: a person named in the question (20 people with the same kinds of facts);
- `date`: a date or year that only one fact holds;
- `number`: a number, code or extension that only one fact holds;
- `multi-hop`: two facts answer it together (recall counts each one).

The set is made here, deterministically: people's facts from templates, the
paraphrases by hand. `bench/retrieval.py` measures recall@5 / @10 of every mode on
every back-end on it and chooses the fusion weight; tests/memory/search/test_memory_hybrid_e2e.py
uses it through the real service.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACES = ("people-a", "people-b")


@dataclass(frozen=True, slots=True)
class Fact:
    key: str
    namespace: str
    text: str


@dataclass(frozen=True, slots=True)
class Question:
    namespace: str
    text: str
    kind: str
    answers: tuple[str, ...]


_PEOPLE = [
    ("Zephyrine Okafor", "she", "her"),
    ("Thaddeus Lindqvist", "he", "his"),
    ("Marisol Achterberg", "she", "her"),
    ("Bartholomew Quist", "he", "his"),
    ("Ottilie Ferreira", "she", "her"),
    ("Ignatius Mbeki", "he", "his"),
    ("Rosalind Vantongeren", "she", "her"),
    ("Cornelius Yamamoto", "he", "his"),
    ("Philippa Nakashima", "she", "her"),
    ("Leopold Szymanski", "he", "his"),
    ("Henrietta Obuya", "she", "her"),
    ("Maximilian Ekwueme", "he", "his"),
    ("Clementine Haraldsen", "she", "her"),
    ("Augustin Petrosyan", "he", "his"),
    ("Beatrix Kowalczyk", "she", "her"),
    ("Florian Adeyemi", "he", "his"),
    ("Wilhelmina Castellanos", "she", "her"),
    ("Desmond Abernathy", "he", "his"),
    ("Griselda Moreau", "she", "her"),
    ("Evander Thorsen", "he", "his"),
]
_JOBS = [
    ("a radiologist", "Norrvik Labs"), ("an actuary", "Pellham Insurance"),
    ("a pastry chef", "Café Brioche"), ("a bridge engineer", "Stahlwerk Partners"),
    ("a librarian", "the Ashgrove Library"), ("a pilot", "Skylark Air"),
    ("a tax lawyer", "Duval & Marsh"), ("a data analyst", "Quantico Retail"),
    ("a veterinarian", "Meadowbank Clinic"), ("a sound designer", "Reverb Studios"),
]  # fmt: skip
_CITIES = [
    "Tromsø", "Valparaíso", "Ljubljana", "Winnipeg", "Tbilisi", "Hobart", "Cusco", "Aarhus",
    "Kraków", "Nagasaki",
]  # fmt: skip
_DISHES = [
    "mushroom risotto", "lamb tagine", "pad thai", "beetroot soup", "fish tacos",
    "spinach dumplings", "goulash", "ramen", "paella", "falafel wraps",
]  # fmt: skip
_MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
]  # fmt: skip

# Hand-written facts and questions that share no word with them: (fact, question).
_PARAPHRASES = [
    ("The user cannot eat peanuts without an allergic reaction", "Which food makes me ill?"),
    ("The user's car broke down and is at the garage", "Why am I without my vehicle?"),
    ("The user is learning to play the cello", "What instrument am I practising?"),
    ("The user feels anxious before public speaking", "What makes me nervous?"),
    ("The user sleeps badly when the bedroom is warm", "Why do I toss and turn at night?"),
    ("The user runs five kilometres every morning", "What is my daily exercise?"),
    ("The user is saving money for a house deposit", "What am I putting cash aside for?"),
    ("The user dislikes horror films", "Which movies should you not recommend to me?"),
    ("The user recently adopted a rescue greyhound", "Do I have a pet?"),
    ("The user prefers trains over flying for short trips", "How do I like to travel?"),
    ("The user's landlord is raising the rent next quarter", "Is my housing getting pricier?"),
    ("The user volunteers at a food bank on weekends", "What charity work do I do?"),
    ("The user is vegetarian and avoids gelatin", "Do I eat meat?"),
    ("The user's laptop battery lasts only an hour", "Is my computer's power holding up?"),
    ("The user wants to become fluent in Portuguese", "Which language am I studying?"),
    ("The user got promoted to team lead in spring", "Did my career advance recently?"),
    ("The user has a fear of deep water", "Am I comfortable swimming far out at sea?"),
    ("The user drinks decaf after noon", "Do I have caffeine in the afternoon?"),
    ("The user's daughter started kindergarten", "Has my child begun school?"),
    ("The user repaired the leaking kitchen tap himself", "Who fixed the sink?"),
]


def _people_facts() -> tuple[list[Fact], list[Question]]:
    facts: list[Fact] = []
    questions: list[Question] = []
    for i, (name, _pronoun, possessive) in enumerate(_PEOPLE):
        ns = NAMESPACES[i % 2]
        first = name.split()[0]
        job, employer = _JOBS[(i * 3) % len(_JOBS)]
        city = _CITIES[(i * 7) % len(_CITIES)]
        dish = _DISHES[(i * 3 + 1) % len(_DISHES)]
        day, month, year = 1 + (i * 5) % 27, _MONTHS[(i * 5) % 12], 1961 + (i * 7) % 40
        extension = 1000 + (i * 7919) % 9000
        badge = f"QX-{4000 + i * 137}"
        start_year = 2003 + (i * 3) % 20
        key = f"p{i}"
        facts += [
            Fact(f"{key}-job", ns, f"{name} works as {job} at {employer}"),
            Fact(f"{key}-city", ns, f"{name} lives in {city} with {possessive} family"),
            Fact(f"{key}-dish", ns, f"{first}'s favourite meal is {dish}"),
            Fact(f"{key}-born", ns, f"{name} was born on {day} {month} {year}"),
            Fact(f"{key}-ext", ns, f"{first} can be reached on phone extension {extension}"),
            Fact(f"{key}-badge", ns, f"{name}'s building badge number is {badge}"),
            Fact(f"{key}-start", ns, f"{first} joined the company in {start_year}"),
        ]
        questions += [
            Question(ns, f"Where does {first} live?", "name", (f"{key}-city",)),
            Question(ns, f"What does {first} do for a living?", "name", (f"{key}-job",)),
            Question(ns, f"What food does {name} love?", "name", (f"{key}-dish",)),
            Question(ns, f"Who was born on {day} {month} {year}?", "date", (f"{key}-born",)),
            Question(ns, f"Whose extension is {extension}?", "number", (f"{key}-ext",)),
            Question(ns, f"Who holds badge {badge}?", "number", (f"{key}-badge",)),
            Question(
                ns,
                f"Where does the person working at {employer} who joined in {start_year} live?",
                "multi-hop",
                (f"{key}-start", f"{key}-city"),
            )
            if i % 2 == 0
            else Question(
                ns,
                f"What is the birthday of the person who lives in {city} and likes {dish}?",
                "multi-hop",
                (f"{key}-city", f"{key}-born"),
            ),
        ]
        if i % 2 == 0:
            questions.append(
                Question(ns, f"Who started working with us in {start_year}?", "date",
                         (f"{key}-start",))
            )  # fmt: skip
    return facts, questions


def retrieval_set() -> tuple[list[Fact], list[Question]]:
    """The facts and the questions, in a fixed order."""
    facts, questions = _people_facts()
    for i, (fact, question) in enumerate(_PARAPHRASES):
        ns = NAMESPACES[i % 2]
        facts.append(Fact(f"u{i}", ns, fact))
        questions.append(Question(ns, question, "paraphrase", (f"u{i}",)))
    return facts, questions


KINDS = ("paraphrase", "name", "date", "number", "multi-hop")
