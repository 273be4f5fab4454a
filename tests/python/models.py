"""The models and data the suite trains: CS336's two toy models as its handout describes them (written here),
and data drawn from fixed seeds."""
import pathlib
import sys

import torch
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts" / "peers"))
from torch_ddp import RMSNorm  # noqa: E402  (computed in float32, returned in the input's dtype)


class ToyModel(nn.Module):
    """10 -> 10 -> 50 -> 5, with a frozen bias that forward uses and a frozen parameter it never uses."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 10, bias=False)
        self.fc2 = nn.Sequential()  # a nested module: names like fc2.fc.weight
        self.fc2.fc = nn.Linear(10, 50)
        self.fc2.fc.bias.requires_grad_(False)
        self.fc3 = nn.Linear(50, 5, bias=False)
        self.no_grad_fixed_param = nn.Parameter(torch.tensor([2.0, 2.0]), requires_grad=False)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2.fc(x))
        return self.fc3(x)


class ToyModelWithTiedWeights(nn.Module):
    """Five bias-free layers where fc4 is fc2's weight: one tensor used twice, listed once by parameters()."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 10, bias=False)
        self.fc2 = nn.Linear(10, 50, bias=False)
        self.fc3 = nn.Linear(50, 10, bias=False)
        self.fc4 = nn.Linear(10, 50, bias=False)
        self.fc5 = nn.Linear(50, 5, bias=False)
        self.fc4.weight = self.fc2.weight

    def forward(self, x):
        for layer in (self.fc1, self.fc2, self.fc3, self.fc4):
            x = torch.relu(layer(x))
        return self.fc5(x)


MODELS = {"toy": ToyModel, "tied": ToyModelWithTiedWeights}


def data(rows=20, seed=1234):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 10, generator=g), torch.randn(rows, 5, generator=g)


class ToyModelWithUnusedParameter(ToyModel):
    """ToyModel plus a trainable parameter forward never uses: its hook never fires, and DDP must not wait for it."""

    def __init__(self):
        super().__init__()
        self.unused = nn.Parameter(torch.randn(3))


MODELS["unused"] = ToyModelWithUnusedParameter


class TokenModel(nn.Module):
    """A small language model of the shape CS336 2026's FSDP test trains: Embedding(100, 64), norm, 64 -> 128,
    ReLU, norm, 128 -> 64, head 64 -> 100; Linear and Embedding sharded, the norms replicated."""

    def __init__(self, vocab=100, d=64, hidden=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.norm1 = RMSNorm(d)
        self.up = nn.Linear(d, hidden, bias=False)
        self.norm2 = RMSNorm(hidden)
        self.down = nn.Linear(hidden, d)  # with a bias: a module with two sharded tensors
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        h = self.norm1(self.embed(tokens))
        h = self.norm2(torch.relu(self.up(h)))
        return self.head(self.down(h))


def tokens(rows=20, length=8, vocab=100, seed=123):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (rows, length), generator=g), torch.randint(0, vocab, (rows,), generator=g)
