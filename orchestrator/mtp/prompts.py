"""The built-in prompt set the MTP drafter's self-distillation asks its target: many kinds of request
(explanations, poems and stories, lists, translation, rewriting, summaries, facts, arithmetic, advice,
letters, text to continue; Python and JavaScript functions and classes, docstring stubs, code to explain
or fix), each kind filled from its own lists, so the drafter learns how the target answers in general
rather than one template's phrasing. Deterministic: the same set on every machine, in an order that
mixes the kinds, so any token budget covers them all. Disjoint from the prompts the benches and tests
measure (`tests/drafters/test_mtp_data.py` checks it).
"""

import random

_TOPICS = [
    "photosynthesis", "the water cycle", "compound interest", "volcanoes", "electric cars", "the phases of the moon",
    "recycling", "how the internet works", "rainbows", "honey bees", "earthquakes", "ocean tides", "vaccines",
    "solar panels", "cloud computing", "black holes", "the Roman Empire", "inflation", "gravity", "DNA",
    "the immune system", "democracy", "supply and demand", "climate change", "plate tectonics", "magnetism",
    "the French Revolution", "machine learning", "encryption", "the stock market", "nuclear power",
    "the human heart", "glaciers", "electricity", "the printing of money", "blockchains", "sound waves",
    "the food chain", "antibiotics", "the Silk Road", "jet engines", "coral reefs", "sleep", "memory",
]
_DEVICES = [
    "a microwave oven", "a thermostat", "a smartphone camera", "a lock and key", "a washing machine", "a compass",
    "a vacuum cleaner", "a GPS receiver", "a toaster", "an elevator", "a bicycle brake", "a light bulb",
    "a hard drive", "a wind turbine", "a pressure cooker", "a barcode scanner", "a hearing aid", "a dishwasher",
]
_WHY = [
    "Why do cats purr?", "Why does bread rise?", "Why does ice float on water?", "Why do we have seasons?",
    "Why does the ocean look blue?", "Why do onions make us cry?", "Why do birds fly south in winter?",
    "Why does metal feel cold to the touch?", "Why do we yawn?", "Why do stars twinkle?", "Why does milk go sour?",
    "Why do we get hiccups?", "Why does the moon change shape?", "Why do planes leave white trails?",
]
_THINGS = [
    "autumn rain", "a lighthouse", "an old library", "the first snow", "a city at dawn", "a quiet forest",
    "a cup of tea", "a train journey", "the desert", "a thunderstorm", "a garden in spring", "the stars",
    "a busy market", "a river", "a cat asleep in the sun", "mountains", "a paper boat", "the last day of summer",
]
_CHARACTERS = [
    "a shy robot", "an old fisherman", "a young baker", "a lost puppy", "a clever fox", "a retired astronaut",
    "a girl who collects stamps", "a dragon afraid of fire", "a lonely lighthouse keeper", "a talking parrot",
]
_EVENTS = [
    "finds a map in the attic", "learns to ride a bicycle", "makes an unexpected friend", "gets lost in a big city",
    "wins a baking contest", "discovers a hidden door", "has to save the village festival", "plants a magic seed",
]
_CATEGORIES = [
    "animals that live in the ocean", "vegetables that grow underground", "countries in South America",
    "musical instruments", "programming languages", "famous painters", "things to pack for the beach",
    "board games", "birds", "sports played with a ball", "kitchen tools", "planets of the solar system",
    "breakfast foods", "jobs in a hospital", "rivers in Europe", "yellow flowers",
]
_SENTENCES = [
    "Where is the nearest train station?", "I would like a cup of coffee with milk, please.",
    "My brother lives in a small house near the sea.", "We are going to the cinema tomorrow evening.",
    "The library closes at six o'clock.", "Can you help me carry these boxes?",
    "I have been learning to cook for two years.", "The children played in the park all afternoon.",
    "It is raining, so take an umbrella.", "This book is more interesting than the film.",
]
_LANGUAGES = ["Spanish", "German", "Italian", "Portuguese", "Dutch", "French"]
_INFORMAL = [
    "gonna be late, traffic is crazy", "can u send me the file asap", "that idea is kinda bad tbh",
    "we need to talk about ur report, its got problems", "thx for the help yesterday, u rock",
    "no way im doing that task again", "the printer's broken again, someone fix it",
    "lunch is on me today, dont argue", "sorry i forgot ur birthday lol",
]
_BAD_GRAMMAR = [
    "She don't like apples.", "Me and him goes to school together.", "Their going to the park later.",
    "I seen that movie yesterday.", "The team are playing good today.", "He have three cat.",
]
_PARAGRAPHS = [
    "The town library opened a new reading room last month. It has forty seats, free wifi and a corner for "
    "children. Visitors say it is quiet and bright, but some asked for longer opening hours on weekends.",
    "Sea otters often hold hands while they sleep so they do not drift apart. They live in kelp forests, use "
    "stones to open shells, and have the thickest fur of any animal.",
    "The company's sales rose by twelve percent this year, mostly thanks to online orders. The shops in the "
    "city centre sold less than before, and two of them will close in the spring.",
    "Marie Curie was the first person to win two Nobel Prizes, in physics and in chemistry. She studied "
    "radioactivity and discovered the elements polonium and radium.",
    "A local school started a garden where pupils grow beans, carrots and herbs. The vegetables are used in "
    "the school kitchen, and the pupils learn about soil, water and insects.",
    "The bridge was closed for repairs for three weeks. Drivers had to take a longer road through the hills, "
    "and the bus company added two extra buses every morning.",
]
_COUNTRIES = ["Kenya", "Norway", "Peru", "Vietnam", "Canada", "Egypt", "Portugal", "New Zealand", "Morocco",
              "Chile", "Iceland", "India", "Mexico", "Greece", "Thailand", "Argentina"]
_PEOPLE = ["Ada Lovelace", "Isaac Newton", "Leonardo da Vinci", "Nelson Mandela", "Galileo Galilei",
           "Florence Nightingale", "Charles Darwin", "Alan Turing", "Frida Kahlo", "Louis Pasteur"]
_PAIRS = [("weather", "climate"), ("a virus", "a bacterium"), ("speed", "velocity"), ("a lake", "a pond"),
          ("RAM", "storage"), ("a crocodile", "an alligator"), ("baking soda", "baking powder"),
          ("a democracy", "a monarchy"), ("an ocean", "a sea"), ("a frog", "a toad")]
_NAMES = ["Tom", "Aisha", "Lena", "Carlos", "Mei", "Omar", "Sara", "Ivan", "Priya", "Jonas"]
_ITEMS = ["marbles", "pencils", "stickers", "cookies", "books", "oranges", "coins", "stamps"]
_ACTIVITIES = ["running a first marathon", "studying for exams", "starting a vegetable garden", "learning to draw",
               "moving to a new city", "keeping a budget", "writing a novel", "training a dog",
               "taking better photos", "staying focused at work", "travelling on a small budget", "cooking for friends"]
_RECIPIENTS = ["my landlord", "a teacher", "a new neighbour", "my team at work", "a hotel", "an old friend"]
_LETTER_TOPICS = ["a broken heater", "a missed deadline", "a birthday party next week", "a change of address",
                  "a lost package", "thanks for a present", "a request for a day off"]
_OPENINGS = ["The old clock in the hallway stopped at midnight, and", "Nobody in the village had ever seen",
             "On the morning of the big race,", "The letter arrived three years too late:",
             "Deep under the city, in a forgotten tunnel,", "When the power went out for the third time,"]
_CODE_TASKS = [
    "reverses a singly linked list", "counts the words in a string", "merges two dictionaries",
    "finds the largest number in a list without using max()", "computes the factorial of n recursively",
    "checks whether a number is prime", "flattens a nested list", "sorts a list of tuples by their second item",
    "removes the vowels from a string", "converts Celsius to Fahrenheit", "computes the greatest common divisor",
    "returns the unique items of a list in their original order", "counts how often each character occurs",
    "checks whether two strings are anagrams", "implements binary search on a sorted list",
    "loads a JSON file into a dictionary", "writes a list of dictionaries to a CSV file",
    "returns the mean and the median of a list", "validates an email address with a regular expression",
    "generates the first n prime numbers", "transposes a matrix given as a list of lists",
    "finds the longest word in a sentence", "rotates a list by k positions", "implements bubble sort",
    "capitalizes every word in a sentence", "splits a list into chunks of size n",
    "computes the dot product of two vectors", "parses an ISO date string into a datetime",
    "returns the second largest number in a list", "converts a Roman numeral to an integer",
    "counts the lines of a text file", "removes duplicate words from a sentence", "checks if a year is a leap year",
    "finds the intersection of two lists", "converts a binary string to an integer", "computes a running total",
    "groups a list of words by their first letter", "checks whether brackets in a string are balanced",
]
_CODE_CLASSES = [("a queue", "enqueue, dequeue and is_empty"), ("a bank account", "deposit, withdraw and balance"),
                 ("a 2D point", "distance_to and __repr__"), ("a to-do list", "add, complete and pending"),
                 ("a temperature sensor", "read, average and reset"), ("an LRU cache", "get and put"),
                 ("a simple counter", "increment, decrement and reset"), ("a rectangle", "area, perimeter and scale")]
_STUBS = [("is_even", "n", "Return True if n is even."), ("average", "numbers", "Return the mean of numbers."),
          ("word_count", "text", "Return the number of words in text."),
          ("clamp", "value, low, high", "Limit value to the range [low, high]."),
          ("last_n", "items, n", "Return the last n items of a list."),
          ("to_snake_case", "name", "Convert a CamelCase name to snake_case."),
          ("power_set", "items", "Return every subset of items as a list of lists."),
          ("read_lines", "path", "Return the lines of a text file without newlines.")]
_SNIPPETS = [
    "def f(xs):\n    return [x * x for x in xs if x % 2 == 0]",
    "total = 0\nfor i in range(1, 11):\n    total += i\nprint(total)",
    "def g(s):\n    return s == s[::-1]",
    "data = {'a': 3, 'b': 1}\nprint(sorted(data, key=data.get))",
    "def h(n):\n    if n < 2:\n        return n\n    return h(n - 1) + h(n - 2)",
]
_BUGGY = [
    "def add_all(xs):\n    total = 0\n    for x in xs:\n        total = x\n    return total",
    "def first_char(s):\n    return s[1]",
    "def is_adult(age):\n    if age > 18:\n        return True\n    return False",
    "def mean(xs):\n    return sum(xs) / len(xs) + 1",
]


def _kinds(r: random.Random) -> list[list[str]]:
    """Every kind of request, each fully expanded (a list of distinct prompts)."""
    js_tasks = _CODE_TASKS[::3]
    return [
        [t.format(x) for x in _TOPICS for t in ("Explain {} in simple terms.", "Describe {} to a beginner.",
                                                "What is {}? Answer in a short paragraph.")],
        [f"How does {d} work?" for d in _DEVICES] + [f"Explain briefly how {d} works." for d in _DEVICES],
        list(_WHY) + [f"{w} Explain it in two sentences." for w in _WHY],
        [t.format(x) for x in _THINGS for t in ("Write a short poem about {}.", "Write a haiku about {}.",
                                                "Write four lines of verse about {}.")],
        [f"Tell a short story about {c} who {e}." for c in _CHARACTERS for e in _EVENTS],
        [f"Continue this story: {o}" for o in _OPENINGS],
        [f"List {n} {c}, one per line." for c in _CATEGORIES for n in ("three", "four", "six")]
        + [f"Name {n} {c}." for c in _CATEGORIES for n in ("five", "seven")],
        [f"Translate to {lang}: {s}" for s in _SENTENCES for lang in _LANGUAGES],
        [f"Rewrite this more politely: {s}" for s in _INFORMAL] + [f"Make this message sound professional: {s}"
                                                                   for s in _INFORMAL]
        + [f"Correct the grammar: {s}" for s in _BAD_GRAMMAR],
        [f"{t}\n\n{p}" for p in _PARAGRAPHS for t in ("Summarize this in one sentence.",
                                                       "What are the key facts in this text?",
                                                       "Rewrite this for a young child.")],
        [f"What is {c} known for?" for c in _COUNTRIES] + [f"Tell me three facts about {c}." for c in _COUNTRIES]
        + [f"Who was {p}, and why are they remembered?" for p in _PEOPLE]
        + [f"What is the difference between {a} and {b}?" for a, b in _PAIRS],
        [f"Q: {n} has {a} {i} and gets {b} more. How many {i} does {n} have now?\nA:"
         for n, i, a, b in ((r.choice(_NAMES), r.choice(_ITEMS), r.randint(2, 40), r.randint(2, 40))
                            for _ in range(30))]
        + [f"Q: A box holds {a} {i}. How many {i} are in {b} boxes?\nA:"
           for i, a, b in ((r.choice(_ITEMS), r.randint(3, 12), r.randint(2, 9)) for _ in range(20))],
        [t.format(a) for a in _ACTIVITIES for t in ("Give me three tips for {}.", "What should I know before {}?",
                                                    "What are common mistakes when {}?")],
        [f"Write a short email to {p} about {t}." for p in _RECIPIENTS for t in _LETTER_TOPICS],
        [f"Write a Python function that {t}." for t in _CODE_TASKS]
        + [f"Write a Python function that {t}, with type hints and a docstring." for t in _CODE_TASKS]
        + [f"Show how to write a Python function that {t}, and give an example call." for t in _CODE_TASKS]
        + [f"Write a JavaScript function that {t}." for t in js_tasks],
        [f"Write a Python class for {c} with {m} methods." for c, m in _CODE_CLASSES],
        [f'def {n}({a}):\n    """{d}"""\n' for n, a, d in _STUBS],
        [f"Explain what this Python code does:\n\n{s}" for s in _SNIPPETS]
        + [f"Find and fix the bug in this function:\n\n{s}" for s in _BUGGY],
    ]


def training_prompts() -> list[str]:
    """The built-in prompt set, every kind shuffled and then dealt in turn (round robin)."""
    r = random.Random(0)
    kinds = _kinds(r)
    for k in kinds:
        r.shuffle(k)
    out, seen = [], set()
    for i in range(max(len(k) for k in kinds)):
        for k in kinds:
            if i < len(k) and k[i] not in seen:
                seen.add(k[i])
                out.append(k[i])
    return out
