"""Cases for flashinfer-meta: page pointers and last-page lengths for scripted and random
lengths, page lists from shuffled page tables, and a scheduler run on tiny-llama in which every
batch's page list must point at exactly the keys the torch backend attends to."""

import random

import torch
import torch.nn.functional as F

from judge import harness
from judge.api import E2E, Obs, case, snapshot


def _layout(obs: Obs, kv_lens, page_size: int) -> None:
    from minisgl.attention import flashinfer_backend as fb

    before = list(kv_lens)
    indptr, last = fb.page_layout(kv_lens, page_size)
    tag = f"kv_lens {kv_lens}, page size {page_size}"
    obs.eq(f"{tag}: kv_indptr", list(indptr))
    obs.eq(f"{tag}: kv_last_page_len", list(last))
    obs.unchanged("kv_lens", before, list(kv_lens))


def _table(rng: random.Random, kv_lens, page_size: int, max_seq_len: int = 64):
    """A page table whose rows hold shuffled whole pages, plus a dummy last row at page `num_pages`."""
    need = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(need) + rng.randint(0, 4)
    pages = list(range(num_pages))
    rng.shuffle(pages)
    table = torch.zeros(len(kv_lens) + 1, max_seq_len, dtype=torch.int32)
    offs = torch.arange(page_size)
    for i, n in enumerate(need):
        mine, pages = pages[:n], pages[n:]
        slots = (torch.tensor(mine)[:, None] * page_size + offs).flatten().to(torch.int32)
        table[i, : len(slots)] = slots[:max_seq_len]
    table[-1] = num_pages * page_size  # the dummy row: every position on the dummy page
    return table


def _gather(obs: Obs, table, rows, kv_lens, page_size: int, tag: str) -> None:
    from minisgl.attention import flashinfer_backend as fb
    from minisgl.kernel import index

    indptr, last = fb.page_layout(kv_lens, page_size)
    before = snapshot(table)
    got = index.gather_page_indices_ref(table, torch.tensor(rows), torch.tensor(indptr, dtype=torch.int32), page_size, indptr[-1])
    obs.eq(f"{tag}: kv_indices", got)
    obs.eq(f"{tag}: kv_indices dtype", str(got.dtype))
    obs.unchanged("the page table", before, table)
    # in the learner's terms: do the pages, expanded to slots and cut at the last page, name the keys?
    same = []
    for i, (row, n) in enumerate(zip(rows, kv_lens)):
        pages = got[indptr[i] : indptr[i + 1]].long()
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[: (len(pages) - 1) * page_size + last[i]]
        same.append(bool(len(slots) == n and torch.equal(slots, table[row, :n].long())))
    obs.eq(f"{tag}: each request's pages, expanded to slots, are its page-table slots", same)


@case("page size 1: one page per key", hint=1)
def ps1(obs: Obs) -> None:
    _layout(obs, [3, 1, 4], 1)


@case("page size 4: partly filled last pages", hint=1)
def ps4(obs: Obs) -> None:
    _layout(obs, [5, 8, 1], 4)


@case("last pages exactly full, and a single key", hint=2)
def full_pages(obs: Obs) -> None:
    _layout(obs, [4, 16, 1, 12], 4)
    _layout(obs, [16, 17, 32], 16)


@case("page numbers from a shuffled page table", hint=3)
def gather_fixed(obs: Obs) -> None:
    rng = random.Random(1)
    table = _table(rng, [5, 8, 1], 4)
    _gather(obs, table, [0, 1, 2], [5, 8, 1], 4, "rows 0, 1, 2")


@case("rows out of order, and a padding request on the dummy row", hint=4)
def gather_rows(obs: Obs) -> None:
    rng = random.Random(2)
    table = _table(rng, [6, 3, 9], 2)
    _gather(obs, table, [2, 0], [9, 6], 2, "rows 2, 0")
    _gather(obs, table, [1, 3], [3, 1], 2, "row 1 and the dummy row 3")


@case("random batches, page sizes and page tables", seeds=4, hint=3)
def random_batches(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(3):
        ps = rng.choice([1, 2, 4, 8, 16])
        lens = [rng.randint(1, 40) for _ in range(rng.randint(1, 6))]
        _layout(obs, lens, ps)
        table = _table(rng, lens, ps)
        order = list(range(len(lens)))
        rng.shuffle(order)
        _gather(obs, table, order, [lens[i] for i in order], ps, f"page size {ps}, rows {order}")


# ---- end to end: the engine's batches ----------------------------------------------------------
def _paged_decode(q, k_pool, v_pool, slots_per_req):
    out = []
    for i, slots in enumerate(slots_per_req):
        k, v = k_pool[slots].transpose(0, 1), v_pool[slots].transpose(0, 1)
        out.append(F.scaled_dot_product_attention(q[i][:, None], k, v, enable_gqa=True)[:, 0])
    return torch.stack(out)


@case("tiny-llama, pages of 4: every batch's page list names the keys the torch backend reads", kind=E2E, hint=4, timeout_s=120)
def engine_batches(obs: Obs) -> None:
    from minisgl.attention import flashinfer_backend as fb
    from minisgl.core import SamplingParams
    from minisgl.kernel import index

    cfg = harness.scheduler_config("tiny-llama", page_size=4, num_pages=96, max_running_reqs=4, max_seq_len=64, prefix_cache="radix")
    sched = harness.make_scheduler(cfg)
    engine = sched.engine
    backend = engine.attn_backend
    ps = engine.page_size
    step = {"n": 0}
    original_prepare, original_attend = backend.prepare_metadata, backend.attend

    def prepare_metadata(batch):
        original_prepare(batch)
        meta = batch.attn_metadata
        lens = [r.device_len for r in batch.reqs]
        indptr, last = fb.page_layout(lens, ps)
        dev = engine.page_table.device
        rows = torch.tensor([r.table_idx for r in batch.reqs], device=dev)
        # the reference gather itself (on a GPU the engine would take its Triton kernel instead)
        indices = index.gather_page_indices_ref(engine.page_table, rows, torch.tensor(indptr, dtype=torch.int32, device=dev), ps, indptr[-1])
        slots = []
        for i in range(batch.size):
            pages = indices[indptr[i] : indptr[i + 1]].long()
            slots.append((pages[:, None] * ps + torch.arange(ps, device=dev)).flatten()[: (len(pages) - 1) * ps + last[i]])
        tag = f"step {step['n']} ({batch.phase}, kv_lens {lens})"
        obs.eq(f"{tag}: kv_indptr, kv_last_page_len", [indptr, last])
        obs.eq(f"{tag}: your pages, expanded to slots, equal the torch backend's slots",
               [bool(torch.equal(s, meta.kv_slots[i, : meta.kv_lens[i]])) for i, s in enumerate(slots)])
        batch._pages_as_slots = slots
        step["n"] += 1

    def attend(q, k, v, layer_id, batch):  # q rotated: what the kernel attends with
        out = original_attend(q, k, v, layer_id, batch)
        if layer_id == 0 and batch.is_decode:
            kv = engine.kv_cache
            ours = _paged_decode(q, kv.k_cache(0), kv.v_cache(0), batch._pages_as_slots)
            obs.close(f"step {step['n'] - 1}: layer 0 attention read through your page list", ours)
        return out

    backend.prepare_metadata, backend.attend = prepare_metadata, attend
    prompts = [[11, 12, 13, 14, 15], [30] * 9, [7], [11, 12, 13, 14, 15, 16, 17]]  # the last shares a prefix
    for p in prompts:
        sched.add_request(p, SamplingParams(max_tokens=5, ignore_eos=True))
    harness.run_until_idle(sched)
