"""An embedded fictional world: facts no pretrained model knows, as a passage corpus with questions.

``SyntheticWorld.generate(seed)`` invents countries, cities, organisations and people with names built from
syllables, links them (a person is born in a city in a country and works for an organisation; an organisation
has a founder, a founding year and a headquarters city; a country has a capital), writes one passage per
entity in the Search-R1 corpus convention (``{"id", "contents": '"Title"\\ntext'}``) and asks single-hop and
two-hop questions about it. Every question carries its reasoning chain (``Hop``): what to search, which
passage answers, the sentence that states the fact and the intermediate answer, so the oracle teacher
(``mempo.data.oracle``) can write exact trajectories and tests can check that BM25 finds each hop.

Design choices, and why:
- Every name token (first name, surname, organisation stem, city, country) is unique across the world and
  at least four letters long, so searching an entity's name retrieves its own passage first: the passage
  repeats the name in its title and its sentences, every other passage mentions it at most once.
- Each fact is stated in exactly one passage: the passage of the entity the question's hop looks up.
- The default world has ~300 passages, so BM25 indexing takes milliseconds.
- Held-out tasks come from a second world (``heldout_world``) whose every name differs from the training
  world's: no held-out question asks about anything the training data mentions, so a held-out answer can only
  come from searching. Both worlds' passages form one corpus (``corpus_passages``), so the agent searches the
  same index in training and evaluation, and a training-world entity can be a held-out distractor.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from mempo.core.tasks import Question

# Repeats weight the draw: plain consonants and vowels are common, clusters and diphthongs rare.
_ONSETS = tuple("bdfgklmnprstvz" * 3) + ("br", "dr", "gr", "kr", "tr", "st", "sk", "th", "vr")
_VOWELS = tuple("aeiou" * 4) + ("ai", "ou", "ei")
_CODAS = ("",) * 8 + ("n", "r", "s", "l", "m") * 2 + ("sk", "th")
_COUNTRY_ENDINGS = ("ria", "dar", "ren", "nesh", "lovia", "mund", "vel")
_ORG_SUFFIXES = ("Holdings", "Group", "Works", "Institute", "Company", "Foundation", "Labs", "Trading")

# Common words and real names of the shape the syllables make; a generated name equal to one is redrawn.
_REAL_WORDS = frozenset(
    """
    about above after again other these those there their them then than this that they with were where
    banana potato tomato domino kimono salami panama manila osaka lima milan paris dakar kabul baku riga
    lemon melon salon talon baron demon venom radar solar polar lunar sugar tenor motor rotor tumor rumor
    pilot robot visitor regular popular develop delete minute total metal medal petal pedal model modal
    local vocal final focal tidal vital rival naval moral coral feral mural rural dental mental rental
    basin cabin robin raisin resin satin latin ruin lion tiger zebra koala puma llama mama papa data
    sofa soda tuna pizza pasta salsa viola tuba drama karma sauna gala coma comet planet tablet ticket
    river liver lover cover power tower mister sister silver never fever lever seven eleven dozen
    oven even open often onion opinion origin orbit unit unity nation station ration motion lotion
    potion notion demand remand moment senator terminal animal manual normal formal thermal
    peter kevin simon susan linda tina nina dora nora lara sara mara vera rosa rita zara tara maria
    anna elena diana dana donna gina lisa mona paula sonia tanya sam ben dan tom tim mike dave steve
    kenya samaria malaria bavaria moldavia serbia gambia zambia namibia bolivia nigeria liberia algeria
    tunisia georgia romania slovenia slovakia latvia estonia lithuania sardinia tasmania australia
    bern rome roma oslo sofia doha lome male niamey bamako nairobi kigali kampala maputo harare luanda
    toronto denver boston dallas austin berlin london madrid lisbon vienna prague warsaw budapest
    """.split()
)


# Entities: ``pid`` is the id of the entity's passage; links are indices into the world's tuples.


@dataclass(frozen=True)
class Person:
    pid: str
    name: str
    birth_year: int
    birth_city: int  # index into SyntheticWorld.cities
    employer: int  # index into SyntheticWorld.orgs


@dataclass(frozen=True)
class Organisation:
    pid: str
    name: str
    stem: str  # the invented word of the name ("Brask" of "Brask Holdings")
    founded_year: int
    headquarters: int  # index into cities
    founder: int  # index into people


@dataclass(frozen=True)
class City:
    pid: str
    name: str
    country: int  # index into countries


@dataclass(frozen=True)
class Country:
    pid: str
    name: str
    capital: int  # index into cities


@dataclass(frozen=True)
class Hop:
    """One step of a reasoning chain: search ``query``, read passage ``passage_id`` (titled ``entity``), whose
    sentence ``fact`` states that the ``relation`` of ``entity`` is ``answer``."""

    query: str
    entity: str
    passage_id: str
    relation: str
    fact: str
    answer: str

    @property
    def wanted(self) -> str:
        """What this hop looks for, in words: "the birth city of Velorin Oskatu"."""
        return f"the {_PHRASES[self.relation]} of {self.entity}"

    @property
    def note(self) -> str:
        """What this hop found, in words: "the birth city of Velorin Oskatu is Lisbara"."""
        return f"{self.wanted} is {self.answer}"


@dataclass(frozen=True)
class SyntheticQuestion:
    """A question with its gold answers and the chain of hops that answers it (last hop's answer = gold)."""

    question: Question
    hops: tuple[Hop, ...]
    template: str


_PHRASES = {
    "birth_city": "birth city",
    "birth_year": "birth year",
    "birth_country": "birth country",
    "employer": "employer",
    "founder": "founder",
    "founded_year": "founding year",
    "headquarters": "headquarters city",
    "country": "country",
    "capital": "capital",
}

# (relations applied in order from the subject, question text with {e} = the subject's name)
_TEMPLATES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("birth_city",), "In which city was {e} born?"),
    (("birth_year",), "In which year was {e} born?"),
    (("birth_country",), "In which country was {e} born?"),
    (("employer",), "Which organisation does {e} work for?"),
    (("founder",), "Who founded {e}?"),
    (("founded_year",), "In which year was {e} founded?"),
    (("headquarters",), "In which city is the headquarters of {e}?"),
    (("country",), "In which country is {e}?"),
    (("capital",), "What is the capital of {e}?"),
    (("founder", "birth_country"), "In which country was the founder of {e} born?"),
    (("founder", "birth_year"), "In which year was the founder of {e} born?"),
    (("founder", "birth_city"), "In which city was the founder of {e} born?"),
    (("headquarters", "country"), "In which country is the headquarters of {e}?"),
    (("employer", "headquarters"), "In which city is the headquarters of the organisation that employs {e}?"),
    (("employer", "founder"), "Who founded the organisation that employs {e}?"),
    (("employer", "founded_year"), "In which year was the organisation that employs {e} founded?"),
    (("birth_country", "capital"), "What is the capital of the country where {e} was born?"),
)
_SUBJECT_KIND = {
    "birth_city": "person", "birth_year": "person", "birth_country": "person", "employer": "person",
    "founder": "org", "founded_year": "org", "headquarters": "org", "country": "city", "capital": "country",
}  # fmt: skip
SPLITS = ("train", "val", "test")


def _syllable(rng: random.Random, first: bool) -> str:
    onset = "" if first and rng.random() < 0.2 else rng.choice(_ONSETS)
    return onset + rng.choice(_VOWELS)


def _new_word(rng: random.Random, used: set[str], syllables: tuple[int, int], ending: tuple[str, ...]) -> str:
    """A fresh capitalised pseudo-word, distinct (case-insensitively) from every word in ``used``."""
    while True:
        n = rng.randint(*syllables)
        word = "".join(_syllable(rng, i == 0) for i in range(n)) + rng.choice(ending)
        if len(word) >= 4 and word not in used and word not in _REAL_WORDS:
            used.add(word)
            return word.capitalize()


@dataclass(frozen=True)
class SyntheticWorld:
    """A deterministic fictional knowledge base (see the module docstring). Build with ``generate``."""

    seed: int
    people: tuple[Person, ...]
    orgs: tuple[Organisation, ...]
    cities: tuple[City, ...]
    countries: tuple[Country, ...]

    @classmethod
    def generate(
        cls,
        seed: int,
        *,
        n_people: int = 200,
        n_orgs: int = 60,
        n_cities: int = 40,
        n_countries: int = 12,
        reserved: frozenset[str] = frozenset(),
        id_prefix: str = "",
    ) -> SyntheticWorld:
        """The world of ``seed``: same seed, same world. Needs n_people >= n_orgs >= 1 (every organisation has
        a distinct founder) and n_cities >= n_countries >= 1 (every country has a capital).

        reserved: lower-case name words the world must not use (another world's ``name_words()``).
        id_prefix: prepended to every passage id, so two worlds' passages can share one corpus."""
        if not (n_people >= n_orgs >= 1 and n_cities >= n_countries >= 1):
            raise ValueError(
                "SyntheticWorld.generate: need n_people >= n_orgs >= 1 and n_cities >= n_countries >= 1, got "
                f"n_people={n_people}, n_orgs={n_orgs}, n_cities={n_cities}, n_countries={n_countries}"
            )
        rng = random.Random(seed)
        used: set[str] = set(reserved)
        country_names = [_new_word(rng, used, (2, 2), _COUNTRY_ENDINGS) for _ in range(n_countries)]
        # The first n_countries cities are the capitals, so every country has at least one city.
        city_country = list(range(n_countries)) + [rng.randrange(n_countries) for _ in range(n_cities - n_countries)]
        cities = tuple(
            City(f"{id_prefix}city-{i:04d}", _new_word(rng, used, (2, 3), _CODAS), c)
            for i, c in enumerate(city_country)
        )
        countries = tuple(Country(f"{id_prefix}country-{i:04d}", name, i) for i, name in enumerate(country_names))

        names = [
            f"{_new_word(rng, used, (2, 3), _CODAS)} {_new_word(rng, used, (2, 3), _CODAS)}" for _ in range(n_people)
        ]
        birth_years = [rng.randint(1920, 1995) for _ in range(n_people)]
        birth_cities = [rng.randrange(n_cities) for _ in range(n_people)]
        founders = rng.sample(range(n_people), n_orgs)
        orgs = []
        for i, founder in enumerate(founders):
            stem = _new_word(rng, used, (1, 2), _CODAS[8:])  # stems end in a consonant: "Brask"
            year = rng.randint(birth_years[founder] + 25, min(birth_years[founder] + 55, 2020))
            name = f"{stem} {rng.choice(_ORG_SUFFIXES)}"
            orgs.append(Organisation(f"{id_prefix}org-{i:04d}", name, stem, year, rng.randrange(n_cities), founder))
        employers = [rng.randrange(n_orgs) for _ in range(n_people)]
        people = tuple(
            Person(f"{id_prefix}person-{i:04d}", names[i], birth_years[i], birth_cities[i], employers[i])
            for i in range(n_people)
        )
        return cls(seed, people, tuple(orgs), cities, countries)

    def name_words(self) -> frozenset[str]:
        """Every invented name word of this world, lower-cased (countries, cities, people, organisation stems)."""
        words = [c.name for c in self.countries] + [c.name for c in self.cities] + [o.stem for o in self.orgs]
        words += [part for p in self.people for part in p.name.split()]
        return frozenset(w.lower() for w in words)

    # ---- the corpus ----------------------------------------------------------------------------------------

    def _facts(self, kind: str, index: int) -> tuple[str, str, dict[str, tuple[str, str, tuple[str, int] | None]]]:
        """(passage id, title, relation -> (sentence stating it, answer, the answer's entity or None))."""
        if kind == "person":
            p = self.people[index]
            city = self.cities[p.birth_city]
            country = self.countries[city.country].name
            org = self.orgs[p.employer].name
            born = f"{p.name} was born in {p.birth_year} in {city.name}, {country}."
            works = f"{p.name} works for {org}."
            facts = {
                "birth_year": (born, str(p.birth_year), None),
                "birth_city": (born, city.name, ("city", p.birth_city)),
                "birth_country": (born, country, ("country", city.country)),
                "employer": (works, org, ("org", p.employer)),
            }
            return p.pid, p.name, facts
        if kind == "org":
            o = self.orgs[index]
            founder, hq = self.people[o.founder].name, self.cities[o.headquarters].name
            founded = f"{o.name} is an organisation founded in {o.founded_year} by {founder}."
            located = f"The headquarters of {o.name} are in {hq}."
            facts = {
                "founded_year": (founded, str(o.founded_year), None),
                "founder": (founded, founder, ("person", o.founder)),
                "headquarters": (located, hq, ("city", o.headquarters)),
            }
            return o.pid, o.name, facts
        if kind == "city":
            c = self.cities[index]
            country = self.countries[c.country].name
            return c.pid, c.name, {"country": (f"{c.name} is a city in {country}.", country, ("country", c.country))}
        k = self.countries[index]
        capital = self.cities[k.capital].name
        sentence = f"{k.name} is a country. The capital of {k.name} is {capital}."
        return k.pid, k.name, {"capital": (sentence, capital, ("city", k.capital))}

    def _entities(self) -> list[tuple[str, int]]:
        return (
            [("person", i) for i in range(len(self.people))]
            + [("org", i) for i in range(len(self.orgs))]
            + [("city", i) for i in range(len(self.cities))]
            + [("country", i) for i in range(len(self.countries))]
        )

    def passages(self) -> list[dict[str, str]]:
        """One passage per entity, ``{"id", "contents"}`` with contents ``'"Title"\\n'`` + its facts."""
        out = []
        for kind, index in self._entities():
            pid, title, facts = self._facts(kind, index)
            sentences = list(dict.fromkeys(fact[0] for fact in facts.values()))  # dedupe, keep order
            out.append({"id": pid, "contents": f'"{title}"\n' + " ".join(sentences)})
        return out

    def write_corpus(self, path: str | Path, *, with_heldout: bool = False) -> Path:
        """Write ``passages()`` (``with_heldout``: ``corpus_passages(self)``, this world's and its held-out
        world's) as JSONL, one ``{"id", "contents"}`` per line; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as f:
            for passage in corpus_passages(self) if with_heldout else self.passages():
                f.write(json.dumps(passage, ensure_ascii=False) + "\n")
        return path

    # ---- questions -----------------------------------------------------------------------------------------

    def _chain(self, kind: str, index: int, relations: tuple[str, ...]) -> tuple[tuple[Hop, ...], tuple[str, ...]]:
        """The hops of ``relations`` applied from entity (kind, index), and the gold aliases of the last one."""
        hops = []
        aliases: tuple[str, ...] = ()
        for relation in relations:
            pid, title, facts = self._facts(kind, index)
            sentence, answer, target = facts[relation]
            hops.append(Hop(query=title, entity=title, passage_id=pid, relation=relation, fact=sentence, answer=answer))
            aliases = (answer,)
            if target is not None:
                kind, index = target
                if kind == "org":  # an organisation is also known by its invented word alone
                    aliases = (answer, self.orgs[index].stem)
        return tuple(hops), aliases

    def all_questions(self) -> list[SyntheticQuestion]:
        """Every question the templates ask about this world, in a fixed order (qids are unique). A question
        whose answer is its own subject (a founder who works for the organisation they founded) is left out."""
        out = []
        for kind, index in self._entities():
            for relations, text in _TEMPLATES:
                if _SUBJECT_KIND[relations[0]] != kind:
                    continue
                hops, answers = self._chain(kind, index, relations)
                if hops[-1].answer == hops[0].entity:  # "who founded the organisation that employs X?" -> X
                    continue
                template = ".".join(relations)
                qid = f"w{self.seed}-{template}-{hops[0].passage_id}"
                out.append(SyntheticQuestion(Question(text.format(e=hops[0].entity), answers, qid), hops, template))
        return out

    def questions(
        self, split: str, *, seed: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    ) -> list[SyntheticQuestion]:
        """The questions of ``split`` ("train", "val" or "test"): all questions shuffled by ``seed`` and cut by
        ``fractions``, so the three splits are disjoint and cover every question; same seed, same split."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
            raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
        pool = self.all_questions()
        random.Random(seed).shuffle(pool)
        n_train = round(fractions[0] * len(pool))
        n_val = round(fractions[1] * len(pool))
        bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, len(pool))}
        lo, hi = bounds[split]
        return pool[lo:hi]


HELDOUT_SEED_OFFSET = 7919  # the held-out world of world_seed s is generated from seed s + 7919
HELDOUT_ID_PREFIX = "h-"


def heldout_world(train: SyntheticWorld) -> SyntheticWorld:
    """The world held-out tasks ask about: generated from another seed, with none of ``train``'s name words and
    passage ids prefixed ``h-`` (module docstring)."""
    return SyntheticWorld.generate(
        train.seed + HELDOUT_SEED_OFFSET, reserved=train.name_words(), id_prefix=HELDOUT_ID_PREFIX
    )


def corpus_passages(train: SyntheticWorld) -> list[dict[str, str]]:
    """The search corpus: the training world's passages, then the held-out world's."""
    return train.passages() + heldout_world(train).passages()


def split_questions(train: SyntheticWorld, split: str, *, seed: int) -> list[SyntheticQuestion]:
    """Entity-level split: "train" is every question about ``train`` (in a fixed order); "val" and "test" are the
    two halves of the held-out world's questions, shuffled by ``seed``. Held-out and training questions share no
    entity, so no held-out fact appears in any training task or teacher trajectory."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "train":
        return train.all_questions()
    return heldout_world(train).questions(split, seed=seed, fractions=(0.0, 0.5, 0.5))
