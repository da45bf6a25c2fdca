"""Supervised fine-tuning's labels and loss (chapter 16), against a hand computation and
against TRL's ``SFTTrainer`` with ``assistant_only_loss=True``.

TRL's loss for a fixed batch, without training: the trainer is built on the same conversations,
its own train dataloader gives the collated batch (its padding and labels), and its
``SFTTrainer.compute_loss`` gives the loss, on our model saved with ``save_pretrained`` and read
by ``AutoModelForCausalLM``.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the network

import pytest
import torch

from minitransformer import GPT, GPTConfig, Llama, LlamaConfig, train
from minitransformer.bpe import GPT2_PATTERN, BPETokenizer
from minitransformer.chat import END_OF_TURN, PAD, encode_chat, write_chat_template
from minitransformer.sft import IGNORE_INDEX, sft_batch, sft_labels, sft_loss
from test_chat import CORPUS, SPECIALS, random_conversations  # tests/ is on sys.path
from helpers import perturbed

CONVERSATIONS = [
    [{"role": "system", "content": "Answer in one word."},
     {"role": "user", "content": "Héllo 😀, what is the cat?"},
     {"role": "assistant", "content": "An animal."}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""},
     {"role": "user", "content": "again, longer this time"},
     {"role": "assistant", "content": "the dog ran away from the house"}],
    [{"role": "user", "content": "one two three four five six seven eight nine"},
     {"role": "assistant", "content": "ok"}],
    [{"role": "user", "content": "<|USER|> is not a marker"},
     {"role": "assistant", "content": "日本語 and\nnew lines\n"},
     {"role": "system", "content": "be kind"}, {"role": "user", "content": "?"}],
]


@pytest.fixture(scope="module")
def tok():
    text = CORPUS.read_text(encoding="utf-8")[:20_000]
    return BPETokenizer.train(text, 400, pattern=GPT2_PATTERN, special_tokens=SPECIALS)


@pytest.fixture(scope="module")
def models(tok):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=len(tok), context_length=256, d_model=32, num_heads=4,
                        num_layers=2))
    llama = Llama(LlamaConfig(vocab_size=len(tok), context_length=256, num_layers=2,
                              num_heads=4, num_kv_heads=2, d_model=32))
    return {"gpt": perturbed(gpt), "llama": perturbed(llama)}


def by_hand(model, tok, conversations):
    """Each conversation alone, no padding: -log p(token t+1 | tokens <= t) summed where the
    token t+1 is the assistant's, over the count of such tokens in the whole batch."""
    total, count = 0.0, 0
    for messages in conversations:
        ids, mask = encode_chat(tok, messages)
        with torch.no_grad():
            logits = model(torch.tensor([ids]))[0][0].double()
        logp = logits.log_softmax(-1)
        for t in range(len(ids) - 1):
            if mask[t + 1]:
                total -= logp[t, ids[t + 1]].item()
                count += 1
    return total / count


def test_labels_keep_the_assistant_tokens_only(tok):
    ids, mask = encode_chat(tok, CONVERSATIONS[0])
    labels = sft_labels(ids, mask)
    s = tok.special_tokens
    answer = tok.encode("An animal.")
    assert labels == [IGNORE_INDEX] * (len(ids) - len(answer) - 1) + answer + [s[END_OF_TURN]]
    assert s["<|assistant|>"] not in labels and s["<|user|>"] not in labels
    assert sft_labels([5, 6, 7], [0, 1, 1]) == [-100, 6, 7]


@pytest.mark.parametrize("ids, mask, error, match", [
    ([1, 2], [True], ValueError, "ids and mask must have the same length, got 2 and 1"),
    ([1, 2], [True, 2], TypeError, r"mask\[1\] must be True or False, got 2"),
    ([1, 2], [True, "yes"], TypeError, r"mask\[1\] must be True or False"),
    ([1, 2], [True, 1.0], TypeError, r"mask\[1\] must be True or False"),
    ("ab", [True, True], TypeError, "ids must be a list"),
    ([1, 2], torch.tensor([1, 1]), TypeError, "mask must be a list"),
])
def test_labels_refusals(ids, mask, error, match):
    with pytest.raises(error, match=match):
        sft_labels(ids, mask)


def test_batch_shifts_once_and_pads(tok):
    idx, targets = sft_batch(tok, CONVERSATIONS)
    encoded = [encode_chat(tok, m) for m in CONVERSATIONS]
    longest = max(len(ids) for ids, _ in encoded)
    assert idx.shape == targets.shape == (len(CONVERSATIONS), longest - 1)
    assert idx.dtype == targets.dtype == torch.int64
    for row, (ids, mask) in enumerate(encoded):
        n = len(ids) - 1
        assert idx[row, :n].tolist() == ids[:-1]
        assert targets[row, :n].tolist() == sft_labels(ids, mask)[1:]
        assert (idx[row, n:] == tok.special_tokens[PAD]).all()
        assert (targets[row, n:] == IGNORE_INDEX).all()
    # every end-of-turn that closes an assistant's turn is a target, no marker is
    ends = sum(1 for m in CONVERSATIONS for x in m if x["role"] == "assistant")
    assert (targets == tok.special_tokens[END_OF_TURN]).sum() == ends
    for marker in ("<|system|>", "<|user|>", "<|assistant|>", PAD):
        assert not (targets == tok.special_tokens[marker]).any()


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_loss_equals_the_hand_computation(tok, models, name):
    conversations = CONVERSATIONS + random_conversations(12, seed=3)
    conversations = [c for c in conversations if any(m["role"] == "assistant" for m in c)]
    loss = sft_loss(models[name], tok, conversations)
    assert loss.item() == pytest.approx(by_hand(models[name], tok, conversations), abs=1e-5)


def test_batch_refusals(tok):
    user_only = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match=r"conversations\[1\] has no assistant tokens"):
        sft_batch(tok, [CONVERSATIONS[0], user_only])
    with pytest.raises(ValueError, match=r"conversations\[0\]: messages\[0\] has role 'bot'"):
        sft_batch(tok, [[{"role": "bot", "content": "x"}]])
    with pytest.raises(TypeError, match=r"conversations\[0\]: messages\[1\]\['content'\]"):
        sft_batch(tok, [[{"role": "user", "content": "x"},
                         {"role": "assistant", "content": 5}]])
    with pytest.raises(ValueError, match="conversations is empty"):
        sft_batch(tok, [])
    with pytest.raises(TypeError, match="conversations must be a list of conversations"):
        sft_batch(tok, CONVERSATIONS[0][0])
    length = len(encode_chat(tok, CONVERSATIONS[1])[0])
    with pytest.raises(ValueError, match=rf"conversations\[1\] is {length} tokens long, more "
                                         rf"than the context of {length - 2} \+ 1"):
        sft_batch(tok, CONVERSATIONS[:2], context_length=length - 2)
    assert sft_batch(tok, CONVERSATIONS[1:2], context_length=length - 1)[0].shape[1] == length - 1
    plain = BPETokenizer(tok.merges, pattern=GPT2_PATTERN)
    with pytest.raises(ValueError, match="no chat format"):
        sft_batch(plain, CONVERSATIONS)


def test_loss_refusals(tok, models):
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        sft_loss("gpt2", tok, CONVERSATIONS)
    long = [{"role": "user", "content": "the cat " * 200}, {"role": "assistant", "content": "a"}]
    with pytest.raises(ValueError, match=r"conversations\[0\] is \d+ tokens long, more than the "
                                         r"context of 256"):
        sft_loss(models["gpt"], tok, [long])


def test_fine_tuning_runs_in_the_training_loop(tok):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(tok), context_length=64, d_model=16, num_heads=2,
                          num_layers=1))
    batch = sft_batch(tok, CONVERSATIONS)
    before = sft_loss(model, tok, CONVERSATIONS).item()
    train(model, [batch], steps=5, lr=1e-2, progress=False)
    assert sft_loss(model, tok, CONVERSATIONS).item() < before


@pytest.fixture(scope="module")
def trl_loss(tok, models, tmp_path_factory):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    def loss(name, conversations):
        path = tmp_path_factory.mktemp(name)
        tok.save_pretrained(path)
        write_chat_template(path, tok)
        models[name].save_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        args = SFTConfig(output_dir=str(path / "out"), assistant_only_loss=True, use_cpu=True,
                         report_to=[], save_strategy="no", disable_tqdm=True,
                         per_device_train_batch_size=len(conversations))
        trainer = SFTTrainer(model=model, args=args, processing_class=AutoTokenizer
                             .from_pretrained(path), train_dataset=Dataset.from_list(
                                 [{"messages": m} for m in conversations]))
        rows = [trainer.train_dataset[i] for i in range(len(conversations))]
        batch = next(iter(trainer.get_train_dataloader()))  # the whole data set, collated
        assert batch["input_ids"].shape[0] == len(conversations)
        model.eval()
        with torch.no_grad():
            return trainer.compute_loss(model, dict(batch)).item(), rows

    return loss


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_loss_equals_trl_sft_trainer(tok, models, trl_loss, name):
    conversations = CONVERSATIONS + [c for c in random_conversations(8, seed=11)
                                     if any(m["role"] == "assistant" for m in c)]
    theirs, rows = trl_loss(name, conversations)
    for messages, row in zip(conversations, rows):  # TRL's ids and labels are ours
        ids, mask = encode_chat(tok, messages)
        assert row["input_ids"] == ids
        assert row["labels"] == sft_labels(ids, mask)
    ours = sft_loss(models[name], tok, conversations).item()
    assert abs(ours - theirs) <= 1e-5, (ours, theirs)
