"""Varied prompts for losslessness tests: chat, code, lists, grounded rewrites."""

PROMPTS = [
    "Write a short poem about the ocean at night.",
    "Explain in two sentences how a bicycle gear works.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "List five fruits that are red, one per line.",
    "Summarize: The city council met on Tuesday to discuss the new park. Residents asked for more "
    "trees, a playground and better lighting. The council agreed to fund the playground first.",
    "Translate to French: The weather is nice today and I would like to go for a walk.",
    "What is the capital of Japan, and what is it famous for?",
    "Rewrite more formally: hey guys, the meeting got moved to friday cuz the boss is out.",
    "Give three tips for writing clean Python code.",
    "Once upon a time, in a small village by the mountains, there lived",
    "Q: If I have 3 apples and buy 4 more, how many apples do I have?\nA:",
    "The history of the printing press begins",
]

GROUNDED = (
    "Rewrite the following paragraph in simpler words, keeping all the facts.\n\n"
    "Paragraph: The Amazon rainforest covers much of the Amazon basin of South America. The basin "
    "encompasses seven million square kilometres, of which five and a half million square kilometres "
    "are covered by the rainforest. The region includes territory belonging to nine nations. The "
    "majority of the forest is contained within Brazil, with 60% of the rainforest, followed by Peru "
    "with 13%, and Colombia with 10%.\n\nSimpler version:"
)

CODE = [  # code workload for the Qwen2.5-Coder pair
    "Write a Python function that checks whether a string is a palindrome, with a docstring and tests.",
    "Write a Python class for a stack with push, pop and peek methods and type hints.",
    "Write a Python function that reads a CSV file and returns the sum of its second column.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python function that counts word frequencies in a text and returns the top ten.",
]
