"""Qwen3.5 hybrid targets (Gated DeltaNet + gated full attention), fp32 on the CPU against
transformers: logits of prefills and trees, the recurrent commit, lossless greedy speculative
decoding over the tree grid, and state reuse across turns."""
import pytest
import torch

from engine_helpers import TREE_GRID, OracleDraft, hf_greedy, hf_model, random_prompt, run, tiny_engine
from jetspec_chat.engine.model import ForwardBatch
from jetspec_chat.engine.tree import ancestor_mask

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = ["tiny-qwen3.5", "tiny-qwen3.5-moe"]
# A tree with branching at several depths (children listed after their parents, not depth-first).
PARENTS = [-1, 0, 0, 1, 1, 2, 3, 5, 5, 6, 9, 10]
TOKENS = [7, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]


def _depths(parents):
    d = []
    for p in parents:
        d.append(0 if p < 0 else d[p] + 1)
    return d


def _prefill(engine, ids, chunks):
    kv = engine.target.make_cache(256, torch.device("cpu"), torch.float32)
    out, start = [], 0
    for n in chunks:
        batch = ForwardBatch(torch.tensor(ids[start:start + n]), torch.arange(start, start + n),
                             torch.ones(n, n, dtype=torch.bool).tril(), start)
        hidden, _ = engine.target(batch, kv)
        kv.commit_chunk(start + n)
        out.append(engine.target.logits(hidden))
        start += n
    return torch.cat(out), kv


def _hf_last(name, ids):
    return hf_model(name)(torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("name", MODELS)
def test_prefill_logits_match_transformers(name):
    engine = tiny_engine(name)
    ids = random_prompt(1, 45)
    with torch.inference_mode():
        ref = hf_model(name)(torch.tensor([ids])).logits[0].float()
        for chunks in ([45], [20, 1, 24], [7] * 6 + [3]):  # chunks shorter than the conv window too
            ours, _ = _prefill(engine, ids, chunks)
            torch.testing.assert_close(ours, ref, rtol=1e-4, atol=2e-5)


@pytest.fixture(params=["reference", "kernel"])
def recurrence(request, monkeypatch):
    """The recurrence as the CPU runs it (the torch reference) or as the GPU does (the Triton
    tree-walk kernel and its one-lane commit, here under the interpreter)."""
    if request.param == "kernel":
        if request.node.callspec.params.get("name", MODELS[0]) != MODELS[0]:
            pytest.skip("the kernel path on one model: the recurrence is the same in the MoE")
        import jetspec_chat.kernels.gated_delta as gd

        monkeypatch.setattr(gd, "_use_triton", lambda *tensors: True)
    return request.param


@pytest.mark.parametrize("name", MODELS)
def test_tree_nodes_match_each_path_run_as_a_plain_sequence(name, recurrence):
    """Each node's logits equal transformers' for its own root-to-node sequence (the conv window
    reaches through ancestors into the committed window, the state is the parent's); after
    committing a path, the next step equals transformers on prefix + path."""
    engine = tiny_engine(name)
    prefix = random_prompt(2, 30)
    depths = _depths(PARENTS)
    mask = ancestor_mask(torch.tensor(PARENTS), max(depths))
    with torch.inference_mode():
        _, kv = _prefill(engine, prefix, [30])
        batch = ForwardBatch(torch.tensor(TOKENS), 30 + torch.tensor(depths), mask, 30)
        hidden, _ = engine.target(batch, kv)
        ours = engine.target.logits(hidden)
        paths = []
        for i in range(len(TOKENS)):
            path, j = [], i
            while j >= 0:
                path.insert(0, j)
                j = PARENTS[j]
            paths.append(path)
            torch.testing.assert_close(ours[i], _hf_last(name, prefix + [TOKENS[j] for j in path]), rtol=1e-4, atol=2e-5)
        # Commit the deepest path (KV rows and recurrent state), then one AR step after it.
        path = paths[-1]
        kv.move_rows(30 + torch.tensor(path), 30 + torch.arange(len(path)))
        kv.commit_path(path)
        kv.length = 30 + len(path)
        step = ForwardBatch(torch.tensor([5]), torch.tensor([kv.length]), torch.ones(1, 1, dtype=torch.bool), kv.length)
        hidden, _ = engine.target(step, kv)
        ref = _hf_last(name, prefix + [TOKENS[j] for j in path] + [5])
        torch.testing.assert_close(engine.target.logits(hidden)[0], ref, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("name", MODELS)
def test_truncate_restores_the_state_inside_the_last_round(name, recurrence):
    """A rollback to a length inside the last commit replays that round's path prefix exactly."""
    engine = tiny_engine(name)
    prefix = random_prompt(3, 20)
    depths = _depths(PARENTS)
    mask = ancestor_mask(torch.tensor(PARENTS), max(depths))
    with torch.inference_mode():
        _, kv = _prefill(engine, prefix, [20])
        engine.target(ForwardBatch(torch.tensor(TOKENS), 20 + torch.tensor(depths), mask, 20), kv)
        path = [0, 2, 5, 8]
        kv.move_rows(20 + torch.tensor(path), 20 + torch.arange(4))
        kv.commit_path(path)
        kv.length = 24
        kv.truncate(22)  # keeps the root and node 2
        assert kv.length == 22
        step = ForwardBatch(torch.tensor([9]), torch.tensor([22]), torch.ones(1, 1, dtype=torch.bool), 22)
        hidden, _ = engine.target(step, kv)
        ref = _hf_last(name, prefix + [TOKENS[0], TOKENS[2], 9])
        torch.testing.assert_close(engine.target.logits(hidden)[0], ref, rtol=1e-4, atol=2e-5)
        kv.truncate(10)  # before every stored state: back to the empty sequence
        assert kv.length == 0


@pytest.mark.parametrize("name", MODELS)
def test_greedy_speculative_equals_transformers(name):
    engine = tiny_engine(name)
    for seed in range(2):
        prompt = random_prompt(seed, 5 + 7 * seed)
        ref = hf_greedy(name, prompt, 20)
        for budget, width, depth, algo in TREE_GRID:
            engine.reset()
            _, res = run(engine, prompt, max_new_tokens=20, budget=budget, width=width, depth=depth, tree_algo=algo)
            assert res.decoded_ids == ref, (seed, budget, width, depth, algo)


@pytest.mark.parametrize("name", MODELS)
def test_long_accepted_paths_stay_lossless(name):
    """An oracle draft gets long paths through the recurrent layers accepted; same output."""
    engine = tiny_engine(name)
    prompt = random_prompt(100, 9)
    ref = hf_greedy(name, prompt, 32)
    taus = []
    for budget, width, depth, algo in TREE_GRID:
        engine.reset()
        with OracleDraft(engine, hf_model(name), error_rate=0.3, seed=0):
            _, res = run(engine, prompt, max_new_tokens=32, budget=budget, width=width, depth=depth, tree_algo=algo)
        assert res.decoded_ids == ref, (budget, width, depth, algo)
        if budget >= 16:
            taus.append(res.mean_accept_length)
    assert max(taus) > 3.0


def test_second_turn_reuses_the_committed_state():
    """Turn two extends turn one's prompt and answer: the whole cached prefix is reused (the
    state at the committed length), and the answer still equals transformers'. A prompt that
    diverges inside the first answer falls back to the stored turn boundary."""
    name = "tiny-qwen3.5"
    engine = tiny_engine(name)
    p1 = random_prompt(5, 12)
    _, r1 = run(engine, p1, max_new_tokens=12, budget=16, width=4)
    p2 = p1 + list(r1.token_ids) + random_prompt(6, 5)
    _, r2 = run(engine, p2, max_new_tokens=12, budget=16, width=4)
    assert r2.reused_tokens >= len(p1) + len(r1.token_ids) - 1
    assert r2.decoded_ids == hf_greedy(name, p2, 12)
    p3 = p2[: len(p1) + 3] + random_prompt(7, 4)  # diverges inside turn one's answer
    _, r3 = run(engine, p3, max_new_tokens=12, budget=16, width=4)
    assert r3.reused_tokens <= len(p1) + 3
    assert r3.decoded_ids == hf_greedy(name, p3, 12)


def test_multimodal_checkpoint_loads_the_text_model(tmp_path):
    """A checkpoint in the published layout (text model under model.language_model., vision
    tower and MTP weights beside it) loads the text weights and skips the rest."""
    import json

    from safetensors.torch import save_file

    from jetspec_chat.engine.hybrid_model import build_hybrid_target
    from jetspec_chat.engine.layers import hf_parameters

    engine = tiny_engine("tiny-qwen3.5")
    tensors = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v.contiguous().clone()
               for k, v in hf_parameters(engine.target)}
    tensors["mtp.fc.weight"] = torch.zeros(2, 2)
    tensors["model.visual.patch_embed.proj.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded = build_hybrid_target(engine.target.cfg, torch.device("cpu"), torch.float32)
    loaded.load_safetensors(tmp_path)
    for (name, ours), (_, theirs) in zip(hf_parameters(loaded), hf_parameters(engine.target)):
        assert torch.equal(ours, theirs), name


def test_whole_answers_through_either_recurrence(recurrence):
    """Whole answers through either recurrence: greedy speculative equals transformers over tree
    rounds with long accepted paths (the commit takes the device path and count), and a second
    turn reuses the state."""
    name = "tiny-qwen3.5"
    engine = tiny_engine(name)
    prompt = random_prompt(11, 9)
    with OracleDraft(engine, hf_model(name), error_rate=0.3, seed=0):
        _, r1 = run(engine, prompt, max_new_tokens=8, budget=16, width=4)
    assert r1.decoded_ids == hf_greedy(name, prompt, 8)
    p2 = prompt + list(r1.token_ids) + random_prompt(12, 3)
    _, r2 = run(engine, p2, max_new_tokens=3, budget=8, width=1, tree_algo="chain")
    assert r2.reused_tokens >= len(prompt) + len(r1.token_ids) - 1
    assert r2.decoded_ids == hf_greedy(name, p2, 3)
