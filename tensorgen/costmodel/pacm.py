"""Pruner's pattern-aware cost model (PaCM, Pruner §2.4) and momentum transfer learning (MTL, §2.5), in PyTorch.

Two branches read a program. The statement branch: every statement's 164 Ansor features with the program's
workload descriptor appended go through an MLP, summed over the program's statements. The data-flow branch: the
tokens of the program's multi-level tiling pattern (features.dataflow: each buffer's tile at L2, L1 and register
level), embedded with their position, through self-attention, averaged. Both are concatenated and an MLP gives the
score. Trained with LambdaRank on each task's programs (the labels are throughputs normalized per task).

Without a pretrained model it learns online like Ansor's model: from `min_samples` measurements on, every update
trains `steps` steps on programs drawn from everything measured (the network is kept between updates: an update
costs the same however much was measured). With a pretrained model
(`path`, or `load`) it is trained at once and learns by MTL: the pretrained network is the Siamese copy; every
update clones it into the target network, trains the target on the measurements (`transfer_steps` steps at
`transfer_lr`) and predicts with it, and every `momentum_every` updates the copy moves towards the target by momentum
(copy = m copy + (1 - m) target, m = 0.99). A saved file fixes the network's shape; how it trains is the config's.

`dataflow=False` / `statements=False` leave a branch out (the ablations). Needs torch (`pip install tensorgen[torch]`).
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from tensorgen.costmodel.base import CostModel, CostModelError, normalize_throughput
from tensorgen.errors import TensorgenError
from tensorgen.features.dataflow import TOKEN_WIDTH, TOKENS, WORKLOAD_WIDTH, split_dataflow
from tensorgen.features.layout import N_FEATURES

__all__ = ["PaCM", "PaCMConfig", "lambda_rank_loss"]

_FORMAT = "tensorgen.costmodel.pacm/1"


def _torch():
    try:
        import torch
    except ImportError:
        raise TensorgenError("the PaCM cost model needs PyTorch: pip install 'tensorgen[torch]'") from None
    return torch


@dataclass(frozen=True)
class PaCMConfig:
    """The network's sizes, which branches it has, and how it trains."""

    hidden: int = 128  # statement branch width
    token_dim: int = 32  # data-flow branch width
    heads: int = 4
    statements: bool = True
    dataflow: bool = True
    steps: int = 64  # training steps per update (each on `batch` programs of one task)
    batch: int = 128
    lr: float = 1e-3
    min_samples: int = 64  # measurements before a model without pretraining predicts
    momentum: float = 0.99
    momentum_every: int = 4  # updates between momentum steps of the Siamese copy
    transfer_steps: int = 64  # MTL: training steps per update of the clone of the Siamese copy
    transfer_lr: float = 1e-3  # ... and their learning rate


_ARCHITECTURE = ("hidden", "token_dim", "heads", "statements", "dataflow")  # what a saved model's config fixes


@dataclass
class _Batch:
    """Programs as tensors: statement rows with the program each belongs to, tokens and their mask."""

    rows: Any  # (R, N_FEATURES + WORKLOAD_WIDTH)
    owner: Any  # (R,) program index
    tokens: Any  # (P, TOKENS, TOKEN_WIDTH)
    mask: Any  # (P, TOKENS) true: a real token
    programs: int


def _arrays(features: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Statement rows (with the workload descriptor), their owners and the token array of each program."""
    rows, owners, tokens = [], [], np.zeros((len(features), TOKENS, TOKEN_WIDTH), np.float32)
    for p, f in enumerate(features):
        stmts, workload, tok = split_dataflow(np.asarray(f, dtype=np.float32))
        if stmts.shape[1:] != (N_FEATURES,):
            raise ValueError(f"program {p}: features must be (rows, {N_FEATURES}), got {stmts.shape}")
        rows.append(np.hstack([stmts, np.broadcast_to(workload, (len(stmts), WORKLOAD_WIDTH))]))
        owners.append(np.full(len(stmts), p))
        tokens[p] = tok
    width = N_FEATURES + WORKLOAD_WIDTH
    return (np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, width), np.float32),
            np.concatenate(owners) if owners else np.zeros(0, np.int64), tokens)


def lambda_rank_loss(scores, labels):
    """LambdaRank (NDCG-weighted pairwise logistic loss) of one list: `scores` predicted, `labels` >= 0 relevance."""
    torch = _torch()
    n = scores.shape[0]
    if n < 2:
        return scores.sum() * 0.0
    order = torch.argsort(scores.detach(), descending=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n)
    discount = 1.0 / torch.log2(rank.to(scores.dtype) + 2.0)
    gain = torch.pow(2.0, labels) - 1.0
    ideal = (torch.sort(gain, descending=True).values / torch.log2(torch.arange(n, dtype=scores.dtype) + 2.0)).sum()
    if ideal <= 0:
        return scores.sum() * 0.0
    better = labels[:, None] > labels[None, :]
    weight = (gain[:, None] - gain[None, :]).abs() * (discount[:, None] - discount[None, :]).abs() / ideal
    pair = torch.nn.functional.softplus(-(scores[:, None] - scores[None, :]))
    return (weight * pair)[better].sum() / max(int(better.sum()), 1)


def _network(cfg: PaCMConfig, seed: int):
    torch = _torch()
    nn = torch.nn

    class PaCMNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.statement = nn.Sequential(nn.Linear(N_FEATURES + WORKLOAD_WIDTH, cfg.hidden), nn.ReLU(),
                                           nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU())
            self.embed = nn.Linear(TOKEN_WIDTH, cfg.token_dim)
            self.position = nn.Parameter(torch.zeros(TOKENS, cfg.token_dim))
            self.attention = nn.TransformerEncoderLayer(cfg.token_dim, cfg.heads, 2 * cfg.token_dim, dropout=0.0,
                                                        batch_first=True)
            self.head = nn.Sequential(nn.Linear(cfg.hidden + cfg.token_dim, 64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, b: _Batch):
            parts = []
            stmt = torch.zeros(b.programs, cfg.hidden)
            if cfg.statements and b.rows.shape[0]:
                stmt = stmt.index_add(0, b.owner, self.statement(b.rows))
            parts.append(stmt)
            flow = torch.zeros(b.programs, cfg.token_dim)
            has = b.mask.any(1)
            if cfg.dataflow and bool(has.any()):
                tok = self.attention(self.embed(b.tokens[has]) + self.position, src_key_padding_mask=~b.mask[has])
                m = b.mask[has].unsqueeze(-1).to(tok.dtype)
                flow = flow.index_put((torch.nonzero(has)[:, 0],), (tok * m).sum(1) / m.sum(1))
            parts.append(flow)
            return self.head(torch.cat(parts, 1)).squeeze(1)

    torch.manual_seed(seed)
    return PaCMNet()


class PaCM(CostModel):
    """PaCM (module docstring); `path`: a pretrained model's file to start from (MTL)."""

    dataflow = True  # reads the data-flow row the feature extractor appends

    def __init__(self, seed: int = 0, path: str | os.PathLike | None = None, config: PaCMConfig = PaCMConfig(),
                 nthread: int = 1) -> None:
        self.seed, self.config, self.nthread = seed, config, nthread
        self._rng = np.random.default_rng(seed)
        self.net = _network(config, seed)
        self.siamese = None  # the pretrained copy (MTL); None: no pretraining
        self.updates = 0
        self._features: list[np.ndarray] = []
        self._throughputs: list[np.ndarray] = []
        self._groups: list[np.ndarray] = []
        self._trained = False
        if path is not None:
            self.load(path)

    @property
    def trained(self) -> bool:
        return self._trained

    @property
    def num_samples(self) -> int:
        return len(self._features)

    @contextmanager
    def _threads(self) -> Iterator[Any]:
        torch = _torch()
        before = torch.get_num_threads()
        torch.set_num_threads(self.nthread)
        try:
            yield torch
        finally:
            torch.set_num_threads(before)

    def _batch(self, features: list[np.ndarray]) -> _Batch:
        torch = _torch()
        rows, owner, tokens = _arrays(features)
        tok = torch.from_numpy(tokens)
        return _Batch(torch.from_numpy(rows), torch.from_numpy(owner.astype(np.int64)), tok,
                      tok[..., :3].abs().sum(-1) > 0, len(features))

    # ---- learning ---------------------------------------------------------------------------

    def update(self, features: list[np.ndarray], throughputs: np.ndarray, groups: np.ndarray | None = None) -> None:
        t = np.asarray(throughputs, dtype=np.float64).reshape(-1)
        g = np.zeros(len(t), dtype=np.int64) if groups is None else np.asarray(groups).reshape(-1)
        if not len(features) == len(t) == len(g):
            raise ValueError(f"{len(features)} feature arrays, {len(t)} throughputs and {len(g)} groups")
        self._features.extend(np.asarray(f, dtype=np.float32) for f in features)
        self._throughputs.append(t)
        self._groups.append(g.astype(str))
        if self.siamese is None and self.num_samples < self.config.min_samples:
            return
        self.updates += 1
        if self.siamese is not None:  # MTL: fine-tune a clone of the Siamese copy, then move the copy by momentum
            self.net = copy.deepcopy(self.siamese)
        steps, lr = (self.config.steps, self.config.lr) if self.siamese is None else \
            (self.config.transfer_steps, self.config.transfer_lr)
        self.fit(self._features, np.concatenate(self._throughputs), np.concatenate(self._groups), steps, lr)
        if self.siamese is not None and self.updates % self.config.momentum_every == 0:
            with _torch().no_grad():
                m = self.config.momentum
                for ps, pt in zip(self.siamese.parameters(), self.net.parameters()):
                    ps.mul_(m).add_(pt, alpha=1 - m)

    def fit(self, features: list[np.ndarray], throughputs: np.ndarray, groups: np.ndarray,
            steps: int | None = None, lr: float | None = None) -> None:
        """Train the network: `steps` LambdaRank steps at learning rate `lr` (default the config's), each on up to
        `batch` programs of one task drawn at random (tasks in proportion to their programs), on throughputs
        normalized per task."""
        y = normalize_throughput(throughputs, groups).astype(np.float32)
        _, inv = np.unique(np.asarray(groups).astype(str), return_inverse=True)
        inv = inv.reshape(-1)
        members = [idx for idx in (np.nonzero(inv == k)[0] for k in range(int(inv.max(initial=-1)) + 1))
                   if len(idx) >= 2]
        if not members:
            return
        weights = np.array([len(idx) for idx in members], dtype=float)
        every = self._batch(features)  # all programs as tensors once; each step selects its rows
        start = np.concatenate([[0], np.cumsum(np.bincount(every.owner.numpy(), minlength=len(features)))])
        with self._threads() as torch:
            opt = torch.optim.Adam(self.net.parameters(), lr=self.config.lr if lr is None else lr)
            self.net.train()
            for _ in range(self.config.steps if steps is None else steps):
                idx = members[int(self._rng.choice(len(members), p=weights / weights.sum()))]
                idx = np.sort(self._rng.choice(idx, min(len(idx), self.config.batch), replace=False))
                counts = start[idx + 1] - start[idx]
                rows = np.repeat(start[idx] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) \
                    + np.arange(counts.sum())
                pick = torch.from_numpy(idx)
                part = _Batch(every.rows[torch.from_numpy(rows)], torch.from_numpy(np.repeat(np.arange(len(idx)),
                                                                                               counts)),
                              every.tokens[pick], every.mask[pick], len(idx))
                loss = lambda_rank_loss(self.net(part), torch.from_numpy(y[idx]))
                if loss.requires_grad:
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            self.net.eval()
        self._trained = True

    def predict(self, features: list[np.ndarray]) -> np.ndarray:
        if not self._trained:
            return self._rng.random(len(features))
        if not features:
            return np.zeros(0)
        with self._threads() as torch, torch.no_grad():
            scores = self.net(self._batch(features)).numpy().astype(np.float64)
        return np.where([f.shape[0] > 0 for f in features], scores, -math.inf)

    # ---- persistence ------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """The network (the target; the pretrained starting point of the next user) and its config."""
        torch = _torch()
        torch.save({"format": _FORMAT, "config": asdict(self.config), "seed": self.seed, "trained": self._trained,
                    "state": self.net.state_dict()}, path)

    def load(self, path: str | os.PathLike) -> None:
        """Start from a saved network as the pretrained Siamese copy (MTL); the measurements so far are kept. The
        file fixes the network's shape; how it trains stays this model's config."""
        torch = _torch()
        try:
            meta = torch.load(path, map_location="cpu", weights_only=True)
        except OSError as err:
            raise CostModelError(f"{path}: cannot read the model ({err.strerror or err})") from None
        except Exception as err:  # torch raises many kinds (pickle, zip, runtime) for a file that is not one
            raise CostModelError(f"{path}: not a PaCM model file ({type(err).__name__})") from None
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            raise CostModelError(f"{path}: not a {_FORMAT} file")
        self.config = replace(self.config, **{k: v for k, v in meta["config"].items() if k in _ARCHITECTURE})
        self.net = _network(self.config, self.seed)
        self.net.load_state_dict(meta["state"])
        self.net.eval()
        self.siamese = copy.deepcopy(self.net)
        self._trained = bool(meta["trained"])
