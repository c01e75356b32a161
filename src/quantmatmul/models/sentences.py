"""sentences.py: a fixed set of English sentences on six topics, the inputs of the MiniLM accuracy measurement (docs/models.md)."""

from __future__ import annotations

__all__ = ["SENTENCES", "TOPICS", "topic_of"]

# Six topics of six sentences, written for this project. Sentences of one topic share vocabulary
# and meaning, so each sentence's nearest neighbour (by cosine of the embeddings) is usually
# another sentence of its topic; a quantized model should keep those neighbours.
TOPICS: dict[str, tuple[str, ...]] = {
    "cooking": (
        "Brown the onions slowly in butter before adding the garlic.",
        "A pinch of salt makes the chocolate cake taste richer.",
        "Let the bread dough rise in a warm place for two hours.",
        "She simmered the tomato sauce until it was thick and sweet.",
        "Rest the steak for five minutes after taking it off the grill.",
        "Fresh basil should be added to the pasta at the very end.",
    ),
    "astronomy": (
        "Jupiter is the largest planet in our solar system.",
        "The telescope captured light from a galaxy billions of years old.",
        "A total solar eclipse happens when the Moon covers the Sun completely.",
        "Neutron stars are so dense that a teaspoon would weigh a billion tons.",
        "Astronomers found an exoplanet orbiting in its star's habitable zone.",
        "The Andromeda galaxy will collide with the Milky Way in four billion years.",
    ),
    "football": (
        "The striker scored twice in the second half to win the match.",
        "Our goalkeeper saved a penalty in the last minute of the game.",
        "The referee showed a red card after the dangerous tackle.",
        "The club signed a young midfielder from the Brazilian league.",
        "Fans sang in the stadium long after the final whistle.",
        "The coach changed the formation to four defenders at half time.",
    ),
    "programming": (
        "This function returns None when the list is empty.",
        "Run the unit tests before you merge the pull request.",
        "A hash map gives constant-time lookups on average.",
        "The compiler reported a type error on line forty-two.",
        "We rewrote the slow loop in C and called it from Python.",
        "Use a mutex so that two threads never write the buffer at once.",
    ),
    "medicine": (
        "The doctor prescribed antibiotics for the bacterial infection.",
        "Regular exercise lowers the risk of heart disease.",
        "The patient's blood pressure was checked every hour after surgery.",
        "Vaccines train the immune system to recognise a virus.",
        "An X-ray showed that the wrist was fractured in two places.",
        "Take one tablet twice a day with food for a week.",
    ),
    "finance": (
        "The central bank raised interest rates to fight inflation.",
        "Diversifying a portfolio reduces the risk of large losses.",
        "The company's shares fell after it reported lower profits.",
        "She pays off her credit card balance in full every month.",
        "Bond prices usually fall when interest rates go up.",
        "The startup raised ten million dollars from venture investors.",
    ),
}

SENTENCES: tuple[str, ...] = tuple(s for sentences in TOPICS.values() for s in sentences)


def topic_of(index: int) -> str:
    """The topic of SENTENCES[index]."""
    for topic, sentences in TOPICS.items():
        if index < len(sentences):
            return topic
        index -= len(sentences)
    raise IndexError(index)
