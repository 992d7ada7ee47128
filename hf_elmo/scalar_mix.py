"""ScalarMix: the task-specific weighting of the biLM layers (Peters et al., 2018, eq. 1)."""

from collections.abc import Sequence

import torch
from torch import nn


class ScalarMix(nn.Module):
    """`gamma * sum_k softmax(w)_k * h_k` over `num_layers` tensors of the same shape.

    The weights are one `(num_layers,)` parameter rather than a `ParameterList` of scalars: replicas made by
    `DataParallel` do not carry `ParameterList` entries, which is how AllenNLP's version broke there.

    Args:
        num_layers: number of tensors mixed.
        initial_weights: the unnormalised `w` to start from (`num_layers` values); zeros (equal weights) when
            omitted.
        initial_gamma: the scale to start from.
        trainable: whether `w` and `gamma` receive gradients.
        do_layer_norm: normalise each layer first with one mean and one variance over all its unmasked elements
            (whole batch, all channels: AllenNLP's statistics, not per-token LayerNorm).
    """

    def __init__(
        self,
        num_layers: int,
        initial_weights: Sequence[float] | None = None,
        initial_gamma: float = 1.0,
        trainable: bool = True,
        do_layer_norm: bool = False,
    ):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"ScalarMix needs at least one layer, got num_layers={num_layers}.")
        if initial_weights is not None and len(initial_weights) != num_layers:
            raise ValueError(
                f"ScalarMix got {len(initial_weights)} initial weights for {num_layers} layers: "
                f"{list(initial_weights)}."
            )
        self.num_layers = num_layers
        self.initial_weights = [0.0] * num_layers if initial_weights is None else [float(w) for w in initial_weights]
        self.initial_gamma = float(initial_gamma)
        largest = torch.finfo(torch.float32).max  # the parameters are float32: a larger value would become inf
        if not all(abs(value) <= largest for value in [*self.initial_weights, self.initial_gamma]):
            raise ValueError(
                f"ScalarMix's initial weights and gamma must be finite float32 numbers (at most {largest:.4g} in "
                f"magnitude), got weights {self.initial_weights} and gamma {self.initial_gamma}."
            )
        self.do_layer_norm = do_layer_norm
        self.trainable = trainable
        self.scalar_parameters = nn.Parameter(torch.tensor(self.initial_weights), requires_grad=trainable)
        self.gamma = nn.Parameter(torch.tensor([self.initial_gamma]), requires_grad=trainable)

    def train(self, mode: bool = True):
        # `from_pretrained` replaces loaded parameters with new trainable ones and ends with `eval()`: re-freeze here.
        self.requires_grad_(self.trainable)
        return super().train(mode)

    def extra_repr(self) -> str:
        return f"num_layers={self.num_layers}, do_layer_norm={self.do_layer_norm}"

    def forward(self, layers: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        """
        Args:
            layers: `num_layers` tensors `(..., D)` of one shape, e.g. `(B, T, 2P)` biLM layers.
            mask: `(...)` (e.g. `(B, T)`), nonzero at real positions; needed only with `do_layer_norm`, where
                it selects the elements the statistics are computed over.

        Returns:
            `(..., D)`: the mix. With `do_layer_norm` masked positions are normalised too (not zeroed).
        """
        if len(layers) != self.num_layers:
            raise ValueError(f"ScalarMix was built for {self.num_layers} layers but got {len(layers)}.")
        shape = layers[0].shape
        if any(layer.shape != shape for layer in layers):
            raise ValueError(f"ScalarMix layers must share one shape, got {[tuple(layer.shape) for layer in layers]}.")
        if self.do_layer_norm:
            if mask is None:
                raise ValueError("ScalarMix with do_layer_norm=True needs the mask of real positions.")
            if mask.shape != shape[:-1]:
                raise ValueError(f"ScalarMix mask must have shape {tuple(shape[:-1])}, got {tuple(mask.shape)}.")
            layers = [self._layer_norm(layer, mask) for layer in layers]
        scalar_parameters, gamma = self.scalar_parameters, self.gamma
        if not self.trainable:
            scalar_parameters, gamma = scalar_parameters.detach(), gamma.detach()
        weights = torch.softmax(scalar_parameters, dim=0).to(layers[0].dtype)
        mixed = sum(weight * layer for weight, layer in zip(weights, layers))
        return gamma.to(mixed.dtype) * mixed

    @staticmethod
    def _layer_norm(layer: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        mask = mask.to(layer.dtype).unsqueeze(-1)
        count = mask.sum() * layer.shape[-1]
        masked = layer * mask
        mean = masked.sum() / count
        variance = (((masked - mean) * mask) ** 2).sum() / count
        # AllenNLP's tiny_value_of_dtype: 1e-13 where representable, 1e-4 in 16-bit floats.
        epsilon = 1e-4 if layer.dtype in (torch.float16, torch.bfloat16) else 1e-13
        return (layer - mean) / torch.sqrt(variance + epsilon)

    def l2_penalty(self) -> torch.Tensor:
        """`sum_k w_k^2`, the regulariser the paper weights with lambda (bilm-tf's `l2_coef`)."""
        return self.scalar_parameters.square().sum()


__all__ = ["ScalarMix"]
