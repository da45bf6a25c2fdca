"""SmolLM2's chat template with the assistant's tokens marked (chapter 16), against
transformers and TRL on the real model.

- :data:`SMOLLM2_TRAINING_TEMPLATE` writes the same text as the GGUF file's own template;
- its ``{% generation %}`` mask, as transformers' ``return_assistant_tokens_mask=True`` gives
  it, is :func:`encode_chat`'s (the reply's tokens and its ``<|im_end|>``);
- :func:`sft_loss` on SmolLM2 equals TRL's ``SFTTrainer`` loss with ``assistant_only_loss=True``
  within 1e-5, TRL reading the same GGUF file through transformers.
"""

import copy
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the network

import pytest
import torch

from minitransformer import pretrained
from minitransformer.bpe import BPETokenizer
from minitransformer.chat import (
    SMOLLM2_CHAT_TEMPLATE,
    SMOLLM2_TRAINING_TEMPLATE,
    apply_chat_template,
    encode_chat,
    render_chat_template,
    training_chat_template,
)
from minitransformer.llama import Llama
from minitransformer.sft import sft_batch, sft_labels, sft_loss
from helpers import smollm2_transformers_model, smollm2_transformers_tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 plus 3?"},
     {"role": "assistant", "content": '{"topic": "math", "answer": "5"}'}],
    [{"role": "system", "content": "Answer in one word."},
     {"role": "user", "content": "Capital of France?"},
     {"role": "assistant", "content": "Paris."},
     {"role": "user", "content": "And of Spain?"},
     {"role": "assistant", "content": "Madrid, I think.\nYes."}],
]
MORE = CONVERSATIONS + [
    [{"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Héllo 😀"}, {"role": "assistant", "content": ""}],
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def path():
    return pretrained.smollm2_path()


@pytest.fixture(scope="module")
def tok(path) -> BPETokenizer:
    return BPETokenizer.from_gguf(path)


@pytest.fixture(scope="module")
def their_tok():
    return smollm2_transformers_tokenizer()


def test_the_gguf_template_is_the_one_marked(tok, their_tok):
    assert tok.chat_template == SMOLLM2_CHAT_TEMPLATE == their_tok.chat_template
    assert training_chat_template(SMOLLM2_CHAT_TEMPLATE) == SMOLLM2_TRAINING_TEMPLATE
    assert training_chat_template(SMOLLM2_TRAINING_TEMPLATE) == SMOLLM2_TRAINING_TEMPLATE
    with pytest.raises(ValueError, match="not one whose marked version"):
        training_chat_template("{{ messages[0]['content'] }}")


@pytest.mark.parametrize("prompt", [False, True])
def test_marked_template_writes_the_same_text(their_tok, prompt):
    for messages in MORE:
        text = their_tok.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=prompt)
        marked, spans = render_chat_template(SMOLLM2_TRAINING_TEMPLATE, messages,
                                             add_generation_prompt=prompt)
        assert marked == text
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert [marked[a:b] for a, b in spans] == [r + "<|im_end|>" for r in replies]


def test_mask_equals_transformers_assistant_mask(tok, their_tok):
    for messages in MORE:
        ids, mask = encode_chat(tok, messages)
        assert ids == apply_chat_template(tok, messages)      # the ids do not change
        theirs = their_tok.apply_chat_template(
            messages, chat_template=SMOLLM2_TRAINING_TEMPLATE, tokenize=True,
            return_dict=True, return_assistant_tokens_mask=True)
        assert ids == theirs["input_ids"]
        assert mask == [bool(b) for b in theirs["assistant_masks"]]
    ids, mask = encode_chat(tok, CONVERSATIONS[0])
    learned = [tok.decode([i]) for i, bit in zip(ids, mask) if bit]
    assert "".join(learned) == CONVERSATIONS[0][1]["content"] + "<|im_end|>"


def test_batch_pads_with_im_end(tok):
    idx, targets = sft_batch(tok, CONVERSATIONS)
    short = len(apply_chat_template(tok, CONVERSATIONS[0])) - 1
    assert (idx[0, short:] == tok.special_tokens["<|im_end|>"]).all()
    assert (targets[0, short:] == -100).all()


def test_loss_equals_trl_sft_trainer(path, tok, their_tok, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    their_tok.chat_template = SMOLLM2_TRAINING_TEMPLATE
    loaded = smollm2_transformers_model()
    # a plain model (a model read from GGUF counts as quantized, which Trainer refuses; helpers
    # keeps the config without it) holding the same float32 weights
    config = copy.deepcopy(loaded.config)
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    model.double()   # float64 on both sides: what is compared is the loss, not the rounding
    args = SFTConfig(output_dir=str(tmp_path / "out"), assistant_only_loss=True, use_cpu=True,
                     report_to=[], save_strategy="no", disable_tqdm=True,
                     per_device_train_batch_size=len(CONVERSATIONS))
    trainer = SFTTrainer(model=model, args=args, processing_class=their_tok,
                         train_dataset=Dataset.from_list([{"messages": m}
                                                          for m in CONVERSATIONS]))
    for messages, row in zip(CONVERSATIONS, trainer.train_dataset):  # TRL's ids and labels
        ids, mask = encode_chat(tok, messages)
        assert row["input_ids"] == ids
        assert row["labels"] == sft_labels(ids, mask)
    batch = next(iter(trainer.get_train_dataloader()))   # the whole data set, collated
    assert batch["input_ids"].shape[0] == len(CONVERSATIONS)
    model.eval()
    with torch.no_grad():
        theirs = trainer.compute_loss(model, dict(batch)).item()
        ours = sft_loss(Llama.from_gguf(path, dtype=torch.float64), tok,
                        CONVERSATIONS).item()
    assert abs(ours - theirs) <= 1e-5, (ours, theirs)
