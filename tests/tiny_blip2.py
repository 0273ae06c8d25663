"""A tiny randomly initialised BLIP-2 (vision, Q-Former, OPT) with a tokenizer built here,
saved with save_pretrained into a folder exactly as a user's model folder (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

WORDS = (
    "a photo of the cat dog bird tree house car road sky water person man woman child "
    "red blue green small large old new on in with near under standing sitting field city "
    "beach mountain street table flower grass building window picture close view white black"
).split()
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<image>"]
NUM_QUERY_TOKENS = 4
IMAGE_SIDE = 32


def tiny_tokenizer():  # -> PreTrainedTokenizerFast
    return word_tokenizer([*SPECIALS, *WORDS])


def word_tokenizer(names: list[str]):  # -> PreTrainedTokenizerFast
    """A word-level tokenizer over `names` (ids in order; SPECIALS among them), as OPT's
    processor expects: `<s>` prepended, words joined with spaces when decoded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(names)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<image>"],
    )


def tiny_blip2_config(vocab_size: int, image_token: int):  # -> Blip2Config
    from transformers import Blip2Config

    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=IMAGE_SIDE,
        patch_size=8,
    )
    qformer = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        encoder_hidden_size=32,
        vocab_size=vocab_size,
        max_position_embeddings=64,
    )
    text = dict(
        model_type="opt",
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        vocab_size=vocab_size,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return Blip2Config(
        vision_config=vision,
        qformer_config=qformer,
        text_config=text,
        num_query_tokens=NUM_QUERY_TOKENS,
        image_token_index=image_token,
    )


def save_tiny_blip2(folder: Path, seed: int = 0) -> Path:
    """Model, tokenizer, image processor and processor, saved into `folder`."""
    import torch
    from transformers import Blip2ForConditionalGeneration, Blip2Processor, BlipImageProcessor

    tokenizer = tiny_tokenizer()
    image = tokenizer.convert_tokens_to_ids("<image>")
    torch.manual_seed(seed)
    model = Blip2ForConditionalGeneration(tiny_blip2_config(len(tokenizer), image)).eval()
    with torch.no_grad():  # the default 0.02 init writes the same word for every image
        for weight in model.parameters():
            if weight.dim() > 1:
                weight.normal_(0, 0.5)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model.generation_config.bos_token_id = 1
    processor = Blip2Processor(
        BlipImageProcessor(size={"height": IMAGE_SIDE, "width": IMAGE_SIDE}),
        tokenizer,
        num_query_tokens=NUM_QUERY_TOKENS,
    )
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def save_tiny_blip(folder: Path, seed: int = 0) -> Path:
    """A tiny BLIP (the first one, not BLIP-2): an image-to-text model that only the auto
    class `AutoModelForImageTextToText` loads, with the same word tokenizer."""
    import torch
    from transformers import (
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessor,
        BlipProcessor,
    )

    tokenizer = tiny_tokenizer()
    layers = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    text = dict(layers, vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = BlipConfig(
        text_config=dict(text, sep_token_id=2),
        vision_config=dict(layers, image_size=IMAGE_SIDE, patch_size=8),
    )
    torch.manual_seed(seed)
    model = BlipForConditionalGeneration(config).eval()
    processor = BlipProcessor(
        BlipImageProcessor(size={"height": IMAGE_SIDE, "width": IMAGE_SIDE}), tokenizer
    )
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
