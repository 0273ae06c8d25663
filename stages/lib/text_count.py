"""Caption length in words, right for every script.

Space-separated scripts (Latin, Cyrillic, Greek, Hangul, Arabic, ...) count words: runs between
whitespace that hold at least one letter or digit (a lone "-" or "|" is no word). Chinese and
Japanese are written without spaces, so their characters (Han, hiragana, katakana) are counted
and turned into word-equivalents: characters / `chars_per_word`, rounded, at least 1.

The rates were measured on tests/data/captions_multilingual.tsv (40 scenes written as parallel
alt-text in English, Chinese and Japanese): 331 English words against 495 Chinese characters
(1.50 per word) and 673 Japanese characters (2.03 per word). Counting characters / 1.5 puts a
Chinese caption within 0.83 words of its English version on average; jieba's segmentation
(281 words, 1.76 characters each) within 1.35, with a weaker correlation (0.51 against 0.69),
at 25x the cost and an extra dependency, so characters it is. A caption holding kana is
Japanese and uses the Japanese rate; any other CJK text uses the Chinese one. Mixed captions
add both parts: "一只橘猫 on a red sofa" is round(4 / 1.5) + 4 = 7 words, as is "an orange cat
on a red sofa".

The other scripts written without spaces between words (`UNSPACED`: Thai, Lao, Tibetan, Myanmar,
Khmer, New Tai Lue, Buginese, Tai Tham, Balinese, Javanese) are counted the same way, by their
base characters: letters and digits, not the combining vowel and tone marks (Mn, Mc) written
above, below or beside them, so "ส้ม" is 2, not 3. The rate, 3.2 base characters per word, is
the token-weighted mean word length of the Thai National Corpus (33.1M word tokens, as
segmented in the frequency list `tnc_freq.txt` that PyThaiNLP ships; its Thai Textbook Corpus
list gives 3.0). No such corpus was at hand for the other scripts; they share Thai's build (an
abugida of mostly one-syllable morphemes, vowels as marks), and on the alt-text "an orange cat
lying on a red sofa" (8 words) the Thai, Lao, Khmer and Burmese versions hold 21, 21, 19 and 22
base characters: 7, 7, 6 and 7 words at 3.2 (their segmenters, PyThaiNLP, LaoNLP and
khmer-nltk, find 7, 8 and 7).
"""

from __future__ import annotations

import re

# Han ideographs (with extension A and compatibility), hiragana, katakana (and half-width).
CJK = re.compile(
    r"[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f]"
)
KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
# Other scripts written without spaces between words (Unicode blocks): Thai and Lao, Tibetan,
# Myanmar (with extensions A and B), Khmer (with Khmer Symbols), New Tai Lue, Buginese and
# Tai Tham, Balinese, Javanese. Hangul is written with spaces and is not one of them.
UNSPACED = re.compile(
    r"[\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff\u1980-\u19ff\u1a00-\u1aaf"
    r"\u1b00-\u1b7f\ua980-\ua9ff\uaa60-\uaa7f]"
)
# Any character of a script written without spaces: CJK or UNSPACED.
NO_SPACES = re.compile(f"{CJK.pattern}|{UNSPACED.pattern}")

ZH_CHARS_PER_WORD = 1.5
JA_CHARS_PER_WORD = 2.0
UNSPACED_CHARS_PER_WORD = 3.2


def is_wordlike(token: str) -> bool:
    return any(ch.isalnum() for ch in token)


def spaced_tokens(text: str, unspaced: re.Pattern[str] = CJK) -> list[str]:
    """The whitespace-separated words of `text` once the characters `unspaced` matches (by
    default CJK) are taken out."""
    return [t for t in unspaced.sub(" ", text).split() if is_wordlike(t)]


def cjk_chars(text: str) -> list[str]:
    return CJK.findall(text)


def unspaced_base_chars(text: str) -> int:
    """Letters and digits of the UNSPACED scripts in `text`; their combining marks and
    punctuation are not counted."""
    return sum(1 for ch in UNSPACED.findall(text) if ch.isalnum())


def word_equivalents(chars: int, chars_per_word: float) -> int:
    """`chars` characters as words: rounded, at least 1 when there is any."""
    return max(1, int(chars / chars_per_word + 0.5)) if chars else 0


def word_count(
    text: str,
    zh_chars_per_word: float = ZH_CHARS_PER_WORD,
    ja_chars_per_word: float = JA_CHARS_PER_WORD,
    unspaced_chars_per_word: float = UNSPACED_CHARS_PER_WORD,
) -> int:
    """Words of the space-separated parts plus the word-equivalents of the CJK part and of
    the other scripts written without spaces."""
    words = len(spaced_tokens(text, NO_SPACES))
    rate = ja_chars_per_word if KANA.search(text) else zh_chars_per_word
    words += word_equivalents(len(cjk_chars(text)), rate)
    return words + word_equivalents(unspaced_base_chars(text), unspaced_chars_per_word)


def tokens(text: str) -> list[str]:
    """Units for repetition checks: space-separated words (casefolded) and single CJK
    characters. Text in the UNSPACED scripts stays in its space-separated runs: their
    characters repeat too often within ordinary words to be judged one by one."""
    return [t.casefold() for t in spaced_tokens(text)] + cjk_chars(text)
