"""caption_filter on scripts written without spaces other than Chinese and Japanese (Thai, Lao,
Khmer, Burmese, ...), its blocklist's matching rules (whole words through a set lookup, CJK and
Thai terms as substrings), and lengths in characters measured on the caption as stored."""

import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.stages.lib.text_count import tokens, word_count
from mmcurate.stages.registry import build_stage

# One alt-text, "an orange cat lying on a red sofa" (8 words), in each script.
PARALLEL = {
    "en": "an orange cat lying on a red sofa",
    "zh": "一只橘猫趴在红色沙发上",
    "ja": "赤いソファの上に寝ているオレンジ色の猫",
    "th": "แมวสีส้มนอนอยู่บนโซฟาสีแดง",
    "lo": "ແມວສີສົ້ມນອນຢູ່ເທິງໂຊຟາສີແດງ",
    "km": "ឆ្មាពណ៌ទឹកក្រូចដេកលើសាឡុងក្រហម",
    "my": "ကြောင်လိမ္မော်ရောင်သည်အနီရောင်ဆိုဖာပေါ်တွင်လှဲနေသည်",
}


def run(options: dict, captions: list) -> dict:
    n = len(captions)
    batch = {
        "__key__": [f"k{i}" for i in range(n)],
        "txt": list(captions),
        "__drop__": [None] * n,
        "__drop_stage__": [None] * n,
    }
    return build_stage({"name": "caption_filter", **options})(batch)


def reasons(options: dict, captions: list) -> list:
    return run(options, captions)["__drop__"]


@pytest.mark.parametrize(
    "language,words",
    # base characters / 3.2: Thai 21, Lao 21, Khmer 19, Burmese 22
    [("th", 7), ("lo", 7), ("km", 6), ("my", 7)],
)
def test_unspaced_scripts_count_word_equivalents(language, words):
    assert word_count(PARALLEL[language]) == words


def test_min_words_treats_every_script_alike():
    captions = list(PARALLEL.values())
    assert reasons({"min_words": 3}, captions) == [None] * len(captions)
    assert reasons({"min_words": 3}, ["แมว", "ឆ្មា", "a cat"]) == ["too_few_words"] * 3


def test_combining_marks_are_not_counted():
    # ส้ม: two letters and a tone mark; ឆ្មា: a letter, a subscript one (coeng + letter) and a
    # vowel sign
    assert word_count("ส้ม", unspaced_chars_per_word=1) == 2
    assert word_count("ឆ្មា", unspaced_chars_per_word=1) == 2
    assert word_count("ส้ม") == 1  # any such text is at least one word
    assert word_count("แมว" * 16) == 15  # 48 letters / 3.2


def test_mixed_and_spaced_scripts_keep_their_counts():
    assert word_count("แมวสีส้ม on a red sofa") == 2 + 4  # 6 Thai letters + 4 words
    assert word_count("빨간 소파 위의 고양이") == 4  # Hangul is written with spaces
    assert word_count("An orange cat on a red sofa") == 7
    assert word_count("一只橘猫 on a red sofa") == 7


def test_unspaced_rate_is_an_option():
    thai = PARALLEL["th"]
    assert reasons({"min_words": 21, "unspaced_chars_per_word": 1}, [thai]) == [None]
    assert reasons({"min_words": 22, "unspaced_chars_per_word": 1}, [thai]) == ["too_few_words"]
    with pytest.raises(ConfigError, match="unspaced_chars_per_word"):
        build_stage({"name": "caption_filter", "unspaced_chars_per_word": 0})


def test_repetition_units_of_unspaced_scripts_stay_their_space_separated_runs():
    """Letters repeat within ordinary Thai words, so they are not judged one by one."""
    assert tokens("แมว นอน แมว") == ["แมว", "นอน", "แมว"]
    assert tokens(PARALLEL["th"]) == [PARALLEL["th"]]


@pytest.mark.parametrize(
    "caption,blocked",
    [
        ("a stock photo of a cat", True),
        ("Stock\t\tPHOTO", True),  # any case, any run of whitespace
        ("stock-photo of a cat", False),  # a space in the term is whitespace only
        ("stockphoto", False),
        ("stock photos", False),  # whole words only
        ("free c++ course", True),  # terms edged with punctuation keep their rule
        ("c++x", False),
        ("new #ad here", True),
        ("new#ad", False),  # preceded by a word character
        ("a co-op store", True),
        ("co-ops", False),
        ("eine STRASSE", True),  # casefolded alike: straße
        ("这是广告图片", True),  # CJK terms match as substrings
        ("ภาพโฆษณาสินค้า", True),  # and so do Thai ones
        ("an orange cat", False),
    ],
)
def test_blocklist_matching_rules(caption, blocked):
    terms = ["Stock Photo", "c++", "#ad", "co-op", "straße", "广告", "โฆษณา"]
    expected = ["blocklisted" if blocked else None]
    assert reasons({"blocklist": terms}, [caption]) == expected


def test_large_blocklist_on_a_long_caption():
    """500 terms against a 200,000-word caption (the old alternation of lookbehind patterns
    took about 20 s on such input; no time is asserted)."""
    terms = [f"term{i}" for i in range(500)] + ["stock photo", "ad"]
    words = " ".join(f"word{i}" for i in range(200_000))
    assert reasons({"blocklist": terms}, [words, words + " term499", words + " stock photo"]) == [
        None,
        "blocklisted",
        "blocklisted",
    ]
    assert reasons({"blocklist": terms}, ["term5000 terms", "a stock  photo."]) == [
        None,
        "blocklisted",
    ]
    assert reasons({"blocklist": ["", "  "]}, ["anything"]) == [None]


def test_max_chars_measures_the_stored_caption():
    padded = "  a cat  " + " " * 20
    out = run({"max_chars": 10}, [padded, "\u3000a cat\u3000", "a cat on a red sofa"])
    assert out["__drop__"] == [None, None, "too_long"]
    assert out["txt"][:2] == ["a cat", "a cat"]
    assert reasons({"max_chars": 10}, [" " * 30]) == ["empty_caption"]
    # kept as it is, the caption is measured as it is
    out = run({"max_chars": 10, "strip": False}, [padded, "a cat"])
    assert out["__drop__"] == ["too_long", None]


def test_min_words_above_max_words_is_a_one_line_config_error():
    assert build_stage({"name": "caption_filter", "min_words": 3, "max_words": 3})
    with pytest.raises(ConfigError) as err:
        build_stage({"name": "caption_filter", "min_words": 4, "max_words": 3})
    assert "max_words must be >= min_words" in str(err.value)
    assert "\n" not in str(err.value)
