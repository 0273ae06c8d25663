"""caption_filter across scripts (word counts for Chinese, Japanese, mixed and English
captions) and its hygiene rules, each with its drop reason."""

import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.stages.lib.text_count import word_count
from mmcurate.stages.registry import build_stage

from tests.kit_stages import labelled


def reasons(options: dict, captions: list) -> list:
    n = len(captions)
    batch = {
        "__key__": [f"k{i}" for i in range(n)],
        "txt": captions,
        "__drop__": [None] * n,
        "__drop_stage__": [None] * n,
    }
    return build_stage({"name": "caption_filter", **options})(batch)["__drop__"]


@pytest.mark.parametrize(
    "caption,words",
    [
        ("An orange cat on a red sofa", 7),  # English: words
        ("an orange cat  -  on a sofa", 6),  # a lone "-" is no word
        ("一只橘猫趴在红色沙发上", 7),  # Chinese: 11 characters / 1.5
        ("猫", 1),  # any CJK text is at least one word
        ("赤いソファの上で眠るオレンジ色の猫", 9),  # Japanese (kana): 17 characters / 2.0
        ("一只橘猫 on a red sofa", 7),  # mixed: round(4 / 1.5) + 4
        ("빨간 소파 위의 고양이", 4),  # Korean is written with spaces: words
        ("Рыжий кот спит на диване", 5),
        ("", 0),
    ],
)
def test_word_count_per_script(caption, words):
    assert word_count(caption) == words


def test_counting_characters_instead():
    assert word_count("一只橘猫趴在红色沙发上", 1.0, 1.0) == 11


def test_parallel_captions_count_like_their_english_version():
    """On the 40 parallel scenes the Chinese and Japanese counts stay close to English."""
    by_scene: dict[int, dict[str, str]] = {}
    for i, (language, caption) in enumerate(labelled()[:240]):
        by_scene.setdefault(i // 6, {})[language] = caption
    for language, limit in (("zh", 1.0), ("ja", 1.6)):
        diffs = [abs(word_count(s[language]) - word_count(s["en"])) for s in by_scene.values()]
        assert sum(diffs) / len(diffs) <= limit, (language, sum(diffs) / len(diffs))


def test_min_words_keeps_chinese_and_mixed_captions():
    captions = ["一只橘猫趴在红色沙发上", "一只橘猫 on a red sofa", "猫", "a cat", "赤い猫"]
    assert reasons({"min_words": 3}, captions) == [
        None,
        None,
        "too_few_words",
        "too_few_words",
        "too_few_words",
    ]
    assert reasons({"max_words": 5}, captions)[:2] == ["too_many_words", "too_many_words"]


@pytest.mark.parametrize(
    "caption,reason",
    [
        ("image", "placeholder_caption"),
        ("Untitled", "placeholder_caption"),
        ("untitled-1", "placeholder_caption"),
        ("IMG_1234", "placeholder_caption"),
        ("DSC01234", "placeholder_caption"),
        ("photo (2)", "placeholder_caption"),
        ("图片", "placeholder_caption"),
        ("img_1234.jpg", "filename_caption"),
        ("holiday-beach_03.JPEG", "filename_caption"),
        ("https://example.com/a/b.jpg", "url_caption"),
        ("www.example.com", "url_caption"),
        ("A picture frame on a wall", None),
        ("An image of a cat", None),
        ("一只橘猫在红色沙发上睡觉", None),
    ],
)
def test_placeholder_alt_text(caption, reason):
    assert reasons({"placeholders": True}, [caption]) == [reason]
    assert reasons({}, [caption]) == [None]  # off by default


def test_placeholder_check_is_linear_on_long_digit_and_dot_runs():
    """Adversarial alt-text (the old trailing-number pattern took 31 s on 40,000 digits):
    judged like any caption, by steps that stay linear; no time is asserted, the old
    pattern would simply not finish this test in reasonable time."""
    digits = "a cat on sofa " + "1" * 2000 + "x"
    assert reasons({"placeholders": True}, [digits, "1" * 40_000 + "x", "a." * 50_000]) == [
        None,
        None,
        None,
    ]
    assert reasons({"placeholders": True}, ["image " + "7" * 2000]) == ["placeholder_caption"]


@pytest.mark.parametrize(
    "caption,reason",
    [
        ("2019-05-03 12:33:01 #4411", "mostly_non_letters"),
        ("$$$ 50% off !!! ***", "mostly_non_letters"),
        ("一只橘猫在红色沙发上睡觉", None),  # Han characters are letters
        ("赤いソファの上で眠る猫", None),
        ("Рыжий кот спит на диване", None),
        ("A cat, 2 dogs & 3 birds", None),
    ],
)
def test_mostly_non_letters(caption, reason):
    assert reasons({"min_letter_fraction": 0.5}, [caption]) == [reason]


@pytest.mark.parametrize(
    "caption,reason",
    [
        ("cat cat cat cat cat", "repeated_tokens"),
        ("free shipping free shipping free shipping", "repeated_tokens"),
        ("好好好好好好好好", "repeated_tokens"),
        ("the cat and the dog on the sofa", None),
        ("一只橘猫在红色沙发上睡觉", None),
        ("cat cat cat", None),  # fewer than min_tokens_for_repeats
    ],
)
def test_repeated_token_spam(caption, reason):
    assert reasons({"max_repeated_fraction": 0.5}, [caption]) == [reason]


def test_natural_captions_pass_every_hygiene_rule():
    rules = {"placeholders": True, "min_letter_fraction": 0.5, "max_repeated_fraction": 0.5}
    captions = [caption for _, caption in labelled()]
    assert reasons(rules, captions) == [None] * len(captions)


def test_blocklist_whole_words_and_cjk_substrings():
    options = {"blocklist": ["Stock Photo", "广告", "click"]}
    captions = [
        "stock photo of a cat",
        "a STOCK  PHOTO",
        "这是广告图片",
        "Click here to buy",
        "clicking sounds",
        "a stockphoto",
        "an orange cat",
    ]
    assert reasons(options, captions) == [
        "blocklisted",
        "blocklisted",  # any case, any run of spaces
        "blocklisted",
        "blocklisted",
        None,  # whole words only
        None,
        None,
    ]


def test_missing_empty_and_bad_options():
    assert reasons({}, [None, "  ", "- | -"]) == [
        "missing_caption",
        "empty_caption",
        "empty_caption",
    ]
    with pytest.raises(ConfigError, match="min_letter_fraction"):
        build_stage({"name": "caption_filter", "min_letter_fraction": 2})
    with pytest.raises(ConfigError, match="zh_chars_per_word"):
        build_stage({"name": "caption_filter", "zh_chars_per_word": 0})
