# PyTorch's fused attention (F.scaled_dot_product_attention) for the references, used when the
# benchmark twin asks for it (scripts/benchmark_models.py --attention sdpa): PyTorch at its best,
# as a user of timm gets it. The golden fixtures are always written with the plain math path.
"""softmax(q k^T * scale + bias, masked) @ v through F.scaled_dot_product_attention."""
import torch
import torch.nn.functional as F

ENABLED = False  # set by scripts/benchmark_models.py; the fixture scripts leave it off


def available():
    """PyTorch 2.1 or later (SDPA with a `scale` argument)."""
    return hasattr(F, "scaled_dot_product_attention") and \
        tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 1)


def attention(q, k, v, scale, keep=None, bias=None):
    """softmax(q k^T * scale + bias) @ v over the last two dims, entries where `keep` is False left
    out. q [..., L, E]; k, v [..., S, E] (broadcast to q's leading dims: static keys); scale a float
    or a tensor (a learnable temperature, folded into q); keep bool, broadcastable to [..., L, S];
    bias additive, broadcastable likewise."""
    if isinstance(scale, torch.Tensor):
        q = q * scale.to(q.dtype)
        scale = 1.0
    k = k.expand(*q.shape[:-2], *k.shape[-2:])
    v = v.expand(*q.shape[:-2], *v.shape[-2:])
    mask = None
    if bias is not None:
        mask = bias.to(q.dtype)
        if keep is not None:
            mask = mask.masked_fill(~keep, float("-inf"))
    elif keep is not None:
        mask = keep
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def off_diagonal(rows, cols, device):
    """True everywhere but the diagonal (the LSA / SKA diagonal mask as SDPA's `keep`)."""
    return ~torch.eye(rows, cols, dtype=torch.bool, device=device)
