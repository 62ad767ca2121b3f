# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp.MlaAttention: a torch.nn.Module over mlacp's MLA layer.

The parameters are ordinary torch Parameters; the C++ layer sees their storage (unmanaged Kokkos Views, no copy)
and is rebuilt, collectively, whenever a parameter's storage changes (``param.data = ...``, ``module.double()``;
``load_state_dict`` and optimizers write in place and keep it). The forward wraps x's storage the same way and
returns y over the layer's own output memory (no copy in or out). Backward runs mlacp's overlapped backward and
writes the gradients straight into fresh torch tensors.
"""
import math

import torch

from . import _mlacp

# MLA_SPEC's weights, in the order the module registers them (and the state_dict lists them).
PARAMETER_NAMES = ("w_q", "b_q", "w_kva", "g_kv", "w_kvb", "b_kvb", "w_o", "b_o")
BIAS_NAMES = ("b_q", "b_kvb", "b_o")
_LAYERS = {torch.float32: _mlacp.Layer_float32, torch.float64: _mlacp.Layer_float64}


def parameter_shapes(config):
    """{name: shape} of MLA_SPEC's weights for ``config`` (biases only with config.bias)."""
    H, D, R = config.heads, config.hidden, config.latent
    qk, kv = config.nope + config.rope, config.nope + config.vdim
    shapes = {
        "w_q": (H * qk, D),
        "b_q": (H * qk,),
        "w_kva": (R + config.rope, D),
        "g_kv": (R,),
        "w_kvb": (H * kv, R),
        "b_kvb": (H * kv,),
        "w_o": (D, H * config.vdim),
        "b_o": (D,),
    }
    return {n: s for n, s in shapes.items() if config.bias or n not in BIAS_NAMES}


def _tensor_error(where, name, t, dtype, ndim):
    """Why mlacp cannot take tensor ``t`` as ``name`` ('' when it can): CPU, ``dtype``, ``ndim`` dims, contiguous."""
    if not isinstance(t, torch.Tensor):
        return f"{where}: {name} is a {type(t).__name__}; expected a torch.Tensor"
    if t.device.type != "cpu":
        return (f"{where}: {name} is on device {t.device}; this build of mlacp runs on the host and takes CPU "
                f"tensors (move it with .cpu())")
    if t.dtype != dtype:
        return f"{where}: {name} has dtype {t.dtype}; expected {dtype} (the dtype of the layer's parameters)"
    if t.dim() != ndim:
        return f"{where}: {name} has {t.dim()} dimensions (shape {list(t.shape)}); expected {ndim}"
    if not t.is_contiguous():
        return (f"{where}: {name} is not contiguous (shape {list(t.shape)}, strides {list(t.stride())}); expected a "
                f"contiguous tensor (call .contiguous())")
    return ""


def _dtype_code(dtype):
    return {torch.float32: 4, torch.float64: 8}.get(dtype, 0)


class _MlaFunction(torch.autograd.Function):
    """y = MLA(x; parameters), with mlacp's backward. Which inputs need a gradient (ctx.needs_input_grad) becomes
    the layer's MlaRequiresGrad, so frozen parameters and an x without grad skip their GEMMs and collectives."""

    @staticmethod
    def forward(ctx, module, x, *params):
        layer, flags = module._prepare(x, params, ctx.needs_input_grad[1:])
        pending, y = layer.forward(x.data_ptr(), tuple(x.shape), flags)
        y = torch.from_numpy(y)
        if any(ctx.needs_input_grad[1:]):
            ctx.pending, ctx.layer, ctx.flags, ctx.mesh = pending, layer, flags, module.mesh
            ctx.names = module._names
            ctx.save_for_backward(x, *params)  # kept alive (the layer reads them) and guarded against in-place edits
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        error = ""
        try:
            x, *params = ctx.saved_tensors  # refused on this rank alone when x or a parameter was edited in place
        except RuntimeError as e:
            error = f"mlacp.MlaAttention.backward: {e}"
        if ctx.mesh.checked:
            ctx.mesh.agree("mlacp.MlaAttention.backward", error, usage=True)  # every rank raises it (UsageError)
        elif error:
            ctx.mesh.report_failure(error)  # no agreement: the others' waits raise CommunicationError naming this rank
        if error:
            raise _mlacp.UsageError(error)
        dy = dy.contiguous()
        needs = ctx.needs_input_grad[2:]
        grads = [torch.zeros_like(p) if need else None for p, need in zip(params, needs)]
        dx = torch.zeros_like(x) if ctx.needs_input_grad[1] else None
        views = {n: (g.data_ptr(), tuple(g.shape)) for n, g in zip(ctx.names, grads) if g is not None}
        pending, ctx.pending = ctx.pending, None
        if pending is None:
            # A second backward through a retained graph (retain_graph=True, gradcheck): mlacp's forward state is
            # consumed by its backward, so the forward runs again on the same (version-checked) x and weights.
            pending, _ = ctx.layer.forward(x.data_ptr(), tuple(x.shape), ctx.flags)
        pending.backward(dy.data_ptr(), tuple(dy.shape), views, 0 if dx is None else dx.data_ptr(),
                         tuple(x.shape))
        return (None, dx, *grads)


class MlaAttention(torch.nn.Module):
    """Multi-head Latent Attention (MLA_SPEC) on a Ulysses group: ``forward(x_local)`` with x_local ``[B, s, D]``
    (this rank's contiguous token shard, s = ``local_seq``: the first S mod P ranks hold ceil(S/P) tokens, the others
    floor(S/P)) returns y_local ``[B, s, D]``.

    Arguments: ``config`` an mlacp.MlaConfig (seq is the global S), ``mesh`` an mlacp.Mesh, ``dtype`` torch.float32
    or torch.float64, ``seed`` (every rank draws the same weights from it: nn.Linear's uniform(+-1/sqrt(in)) for the
    weights and biases, ones for g_kv), ``bias`` (overrides config.bias when given). Construction is collective.

    Weight gradients are this rank's partial sums (MLA_SPEC); ``mlacp.all_reduce_grads(module)`` sums them over the
    mesh. Errors (wrong shape, dtype, device, a non-contiguous tensor) are raised as mlacp.InvalidArgument (a
    ValueError) on every rank of a checked mesh.

    Threads: one host thread at a time per mesh, and per communicator (every mesh, and every layer, over the same
    mpi4py communicator): mlacp releases the GIL in forward and backward, and a second thread entering meanwhile
    raises mlacp.UsageError ("another thread is inside mlacp on this communicator"). A rank that fails in forward or
    backward (after the ranks agreed on the arguments) breaks the mesh: every rank raises mlacp.CommunicationError
    naming it, and every later call on that mesh raises too.
    """

    def __init__(self, config, mesh, dtype=torch.float32, seed=0, bias=None):
        super().__init__()
        config = _mlacp.MlaConfig(config)
        if bias is not None:
            config.bias = bool(bias)
        error = ""
        if dtype not in _LAYERS:
            error = f"mlacp.MlaAttention: dtype {dtype}; expected torch.float32 or torch.float64"
        mesh.agree("mlacp.MlaAttention", error, [("dtype (bytes per value)", _dtype_code(dtype)), ("seed", seed)])
        self.config = config
        self.mesh = mesh
        if config.error(mesh.size):
            _LAYERS[dtype](config, mesh, {})  # the library's message, raised on every rank
            raise _mlacp.InvalidArgument(f"mlacp.MlaAttention: {config.error(mesh.size)}")
        shapes = parameter_shapes(config)
        generator = torch.Generator().manual_seed(seed)
        for name in PARAMETER_NAMES:
            if name not in shapes:
                continue
            shape = shapes[name]
            if name == "g_kv":
                value = torch.ones(shape, dtype=torch.float64)
            else:
                fan_in = shapes["w" + name[1:]][1] if name.startswith("b_") else shape[1]
                bound = 1.0 / math.sqrt(fan_in)
                value = torch.empty(shape, dtype=torch.float64).uniform_(-bound, bound, generator=generator)
            self.register_parameter(name, torch.nn.Parameter(value.to(dtype)))
        self._names = tuple(n for n in PARAMETER_NAMES if n in shapes)
        self._layer = None
        self._storage = None
        # Collective: the library checks the configuration (and these weights) on every rank now, not at the first
        # forward.
        self._layer_for(tuple(getattr(self, n) for n in self._names))

    @property
    def local_seq(self):
        """This rank's token count s: the first S mod P ranks hold ceil(S/P) tokens, the others floor(S/P)."""
        seq, size, rank = self.config.seq, self.mesh.size, self.mesh.rank
        return seq // size + (1 if rank < seq % size else 0)

    @property
    def dtype(self):
        return self.w_q.dtype if hasattr(self, "w_q") else None

    def extra_repr(self):
        return f"{self.config.describe()}, P={self.mesh.size}, dtype={self.dtype}"

    def forward(self, x):
        with self.mesh._entered("mlacp.MlaAttention.forward"):  # one thread at a time, the agreements included
            return _MlaFunction.apply(self, x, *(getattr(self, n) for n in self._names))

    def _layer_for(self, params):
        """The C++ layer over ``params``' storage; a new one (collective) when the storage changed."""
        storage = tuple((p.data_ptr(), p.dtype) for p in params)
        if storage != self._storage:
            layer_type = _LAYERS[params[0].dtype]
            views = {n: (p.data_ptr(), tuple(p.shape)) for n, p in zip(self._names, params)}
            self._layer = None
            self._layer = layer_type(self.config, self.mesh, views)
            self._storage = storage
        return self._layer

    def _prepare(self, x, params, needs_grad):
        """Checks x and the parameters (every rank agrees on the verdict, the dtype and whether the layer is
        rebuilt), then returns the C++ layer and the gradient flags."""
        where = "mlacp.MlaAttention.forward"
        dtype = params[0].dtype
        error = "" if dtype in _LAYERS else (f"{where}: parameter w_q has dtype {dtype}; expected torch.float32 or "
                                             f"torch.float64")
        shapes = parameter_shapes(self.config)
        for name, p in zip(self._names, params):
            error = error or _tensor_error(where, f"parameter {name}", p, dtype, len(shapes[name]))
        error = error or _tensor_error(where, "x", x, dtype, 3)
        rebuild = tuple((p.data_ptr(), p.dtype) for p in params) != self._storage
        self.mesh.agree(where, error, [("dtype (bytes per value)", _dtype_code(dtype)),
                                       ("parameter storage replaced since the last call", int(rebuild))])
        layer = self._layer_for(params)
        flags = _mlacp.MlaRequiresGrad.none()
        flags.x = bool(needs_grad[0])
        for name, need in zip(self._names, needs_grad[1:]):
            setattr(flags, name, bool(need))
        return layer, flags
