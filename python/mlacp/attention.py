# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp.MlaAttention: a torch.nn.Module over mlacp's MLA layer.

The parameters are ordinary torch Parameters; the C++ layer sees their storage (unmanaged Kokkos Views, no copy)
and is rebuilt, collectively, whenever a parameter's storage changes (``param.data = ...``, ``module.double()``;
``load_state_dict`` and optimizers write in place and keep it). The forward wraps x's storage the same way and
returns y over the layer's own output memory (no copy in or out). Backward runs mlacp's overlapped backward and
writes the gradients straight into fresh torch tensors. A parameter (or x) whose storage, dtype or shape changed
between a forward and its backward (``module.half()``, ``p.data = ...``, resharding) is refused by that backward, on
every rank, before the C++ layer reads the old storage. The module's ``config`` is read-only (the C++ layer copied it).

The parameters, their shapes and flags come from the C++ library's parameter table (``parameter_table``).

Mixed precision (bfloat16): the C++ layer of bf16 stores its activations, x, y and dx in bf16, accumulates in float
and writes the weight gradients in float. The module reaches it two ways: bf16 parameters (``dtype=torch.bfloat16``,
whose float gradients accumulate in ``param.main_grad`` and are rounded into the bf16 ``.grad``), or float parameters
computed in bf16 (``compute_dtype=torch.bfloat16``, or automatically under ``torch.autocast("cpu",
dtype=torch.bfloat16)``: the weights are cast into bf16 copies the module owns, and the float gradients go to the
float parameters' ``.grad``). See MlaAttention.
"""
import math
import weakref

import torch

from . import _mlacp
from .deepseek import from_deepseek_state_dict, to_deepseek_state_dict
from .parameters import parameter_shapes, parameter_table
from .token_map import TokenMap


_LAYERS = {
    torch.float32: _mlacp.Layer_float32,
    torch.float64: _mlacp.Layer_float64,
    torch.bfloat16: _mlacp.Layer_bfloat16
}
_DTYPES = "torch.float32, torch.float64 or torch.bfloat16"


def _gradient_dtype(row, weight_dtype):
    """The dtype the C++ backward writes ``row``'s gradient in, for weights of ``weight_dtype``."""
    if row.gradient == "accumulation":
        return torch.float32 if weight_dtype == torch.bfloat16 else weight_dtype
    raise _mlacp.InvalidArgument(f"mlacp: gradient type {row.gradient!r} of {row.name} is not known to this package")


def _bias_weight(bias, shapes):
    """The weight whose output a bias adds to (b_q: w_q, or w_qb with q-LoRA; b_kvb: w_kvb; b_o: w_o)."""
    weight = "w" + bias[1:]
    return weight if weight in shapes else weight + "b"


class FrozenConfig(_mlacp.MlaConfig):
    """A module's configuration, read-only: the C++ layer copied it at construction, so a changed field would be
    ignored. Reads like an mlacp.MlaConfig (and is one, for the library's functions); ``mlacp.MlaConfig(frozen)`` or
    ``copy.copy`` gives a mutable copy for a new module."""

    def __init__(self, config):
        super().__init__(config)

    @property
    def cu_seqlens(self):
        return tuple(_mlacp.MlaConfig.cu_seqlens.__get__(self))

    def __setattr__(self, name, value):
        hint = (" (to change the packing per batch, pass cu_seqlens= to forward)" if name == "cu_seqlens" else
                " (build a new MlaAttention from a changed copy, mlacp.MlaConfig(module.config))")
        raise AttributeError(f"mlacp.MlaAttention: config.{name} cannot be assigned: the configuration is fixed at "
                             f"construction{hint}")

    def __delattr__(self, name):
        self.__setattr__(name, None)


def _tensor_error(where, name, t, dtype, ndim, why="the dtype of the layer's parameters"):
    """Why mlacp cannot take tensor ``t`` as ``name`` ('' when it can): CPU, ``dtype`` (``why``: what that dtype
    is), ``ndim`` dims, contiguous."""
    if not isinstance(t, torch.Tensor):
        return f"{where}: {name} is a {type(t).__name__}; expected a torch.Tensor"
    if t.device.type != "cpu":
        return (f"{where}: {name} is on device {t.device}; this build of mlacp runs on the host and takes CPU "
                f"tensors (move it with .cpu())")
    if t.dtype != dtype:
        return f"{where}: {name} has dtype {t.dtype}; expected {dtype} ({why})"
    if t.dim() != ndim:
        return f"{where}: {name} has {t.dim()} dimensions (shape {list(t.shape)}); expected {ndim}"
    if not t.is_contiguous():
        return (f"{where}: {name} is not contiguous (shape {list(t.shape)}, strides {list(t.stride())}); expected a "
                f"contiguous tensor (call .contiguous())")
    return ""


def _dtype_code(dtype):
    return {torch.bfloat16: 2, torch.float32: 4, torch.float64: 8}.get(dtype, 0)


def _autocast_bf16():
    """Whether this thread runs under ``torch.autocast("cpu", dtype=torch.bfloat16)``."""
    return torch.is_autocast_cpu_enabled() and torch.get_autocast_cpu_dtype() == torch.bfloat16


# bf16 parameters: the float accumulator beside .grad (MlaAttention's docstring). A parameter's
# ``_mlacp_grad_state`` remembers what this package last wrote: (.grad, its version, main_grad, its version); while
# both are unchanged, main_grad is the unrounded value of .grad and the next backward adds to it. Anything else (no
# .grad, zero_grad, a .grad clipped or replaced, main_grad replaced or edited) makes .grad the truth again: main_grad
# restarts from it (zero when there is none).
def _in_step(p):
    state = getattr(p, "_mlacp_grad_state", None)
    main = getattr(p, "main_grad", None)
    if state is None or p.grad is None or main is None:
        return False
    grad_ref, grad_version, main_ref, main_version = state
    return (grad_ref() is p.grad and p.grad._version == grad_version and main_ref() is main
            and main._version == main_version)


def main_grad(p):
    """``p.main_grad`` (float32, p's shape) of a bf16 parameter, made to hold ``p.grad`` unrounded: what the C++
    backward adds this micro-batch's gradient to (and what all_reduce_grads sums). Allocated on first use."""
    main = getattr(p, "main_grad", None)
    if not isinstance(main, torch.Tensor) or main.dtype != torch.float32 or main.shape != p.shape:
        main = torch.zeros(p.shape, dtype=torch.float32)
        p.main_grad = main
    elif not _in_step(p):
        with torch.no_grad():
            if p.grad is None:
                main.zero_()
            else:
                main.copy_(p.grad)
    return main


def publish_grad(p):
    """``p.grad`` (bf16) := ``p.main_grad`` rounded to nearest even, in place where .grad exists."""
    main = p.main_grad
    with torch.no_grad():
        if p.grad is None:
            p.grad = main.to(p.dtype)
        else:
            p.grad.copy_(main)
    p._mlacp_grad_state = (weakref.ref(p.grad), p.grad._version, weakref.ref(main), main._version)


def _offsets(cu_seqlens):
    """(offsets as a list of ints or None, '' or why they cannot be offsets) for forward's ``cu_seqlens``."""
    if cu_seqlens is None:
        return None, ""
    values = cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else cu_seqlens
    try:
        if isinstance(values, (str, bytes)) or any(isinstance(v, (list, tuple)) for v in values):
            raise TypeError
        offsets = [int(v) for v in values]
        if any(o != v for o, v in zip(offsets, values)):
            raise TypeError
    except (TypeError, ValueError):
        return None, (f"mlacp.MlaAttention.forward: cu_seqlens is {cu_seqlens!r}; expected a flat sequence of integer "
                      f"document offsets [0, e_1, ..., S]")
    return offsets, ""


class _MlaFunction(torch.autograd.Function):
    """y = MLA(x; parameters), with mlacp's backward. Which inputs need a gradient (ctx.needs_input_grad) becomes
    the layer's MlaRequiresGrad, so frozen parameters and an x without grad skip their GEMMs and collectives."""

    @staticmethod
    def forward(ctx, module, cu_seqlens, x, *params):
        layer, flags = module._prepare(x, params, ctx.needs_input_grad[2:])
        pending, y = layer.forward(x.data_ptr(), tuple(x.shape), flags, cu_seqlens)
        y = torch.from_numpy(y)
        if x.dtype == torch.bfloat16:
            y = y.view(torch.bfloat16)  # the bf16 layer's y comes as int16 (NumPy has no bfloat16): the same bytes
        if any(ctx.needs_input_grad[2:]):
            ctx.cu_seqlens = cu_seqlens
            ctx.pending, ctx.layer, ctx.flags = pending, layer, flags
            ctx.names, ctx.mesh = module._names, module.mesh
            ctx.rows = {row.name: row for row in parameter_table(module._config)}
            ctx.save_for_backward(x, *params)  # kept alive (the layer reads them) and guarded against in-place edits
            # What the C++ layer and this forward run over: ``p.data = ...`` and ``module.half()`` swap a Parameter's
            # storage without touching the saved Parameter's version, so backward compares against these (detached
            # aliases, which also keep the old storage alive: the check below never sees a reused address).
            ctx.storage = tuple(t.detach() for t in (x, *params))
        return y

    @staticmethod
    def _storage_error(ctx, x, params):
        """Why the backward cannot run over ``x`` and ``params`` ('' when it can): any of them changed storage,
        dtype or shape since the forward (the C++ layer reads the storage the forward saw), or a gradient would not
        have the table's gradient dtype."""
        where = "mlacp.MlaAttention.backward"
        names = ("x",) + tuple(f"parameter {n}" for n in ctx.names)
        for name, now, then in zip(names, (x, *params), ctx.storage):
            if now.dtype != then.dtype:
                what = f"its dtype changed from {then.dtype} to {now.dtype}"
            elif tuple(now.shape) != tuple(then.shape):
                what = f"its shape changed from {list(then.shape)} to {list(now.shape)}"
            elif now.data_ptr() != then.data_ptr():
                what = (f"its storage was replaced (data_ptr {then.data_ptr():#x} -> {now.data_ptr():#x}, e.g. "
                        f"p.data = ... or resharding)")
            else:
                continue
            return (f"{where}: {name} changed between forward and backward: {what}; the layer ran the forward over "
                    f"the old storage and its backward would read it and write gradients of the old dtype. Change "
                    f"parameters (module.half(), .double(), .to(), p.data = ...) before the forward, or run the "
                    f"forward again")
        layer_dtype = ctx.storage[0].dtype  # x's: the layer's value type
        for name, p in zip(ctx.names, params):
            want = _gradient_dtype(ctx.rows[name], layer_dtype)
            have = torch.float32 if p.dtype == torch.bfloat16 else p.dtype  # bf16 parameters: into main_grad
            if have != want:
                return (f"{where}: gradient {name} would have dtype {have}; the layer writes it as {want} (the "
                        f"parameter table's gradient type {ctx.rows[name].gradient!r})")
        return ""

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        try:
            x, *params = ctx.saved_tensors  # refused on this rank alone when x or a parameter was edited in place
        except RuntimeError as e:
            error, usage = f"mlacp.MlaAttention.backward: {e}", True
        else:
            error, usage = _MlaFunction._storage_error(ctx, x, params), False
        if usage and not ctx.mesh.checked:
            ctx.mesh.report_failure(error)  # no agreement: the others' waits raise CommunicationError naming this rank
            raise _mlacp.UsageError(error)
        # Before anything reads the saved storage or writes a gradient, one agreement carries both verdicts: every
        # rank raises the lowest failing rank's error as that rank's kind (UsageError for torch's saved-tensor check,
        # InvalidArgument for the storage check; unchecked, this rank's own).
        ctx.mesh.agree("mlacp.MlaAttention.backward", error, usage=usage)
        layer_dtype = ctx.storage[0].dtype
        dy = dy.to(layer_dtype).contiguous()
        needs = ctx.needs_input_grad[3:]
        # Where the layer adds each weight gradient: a fresh zeroed tensor that autograd accumulates into .grad, or
        # for a bf16 parameter its float main_grad (autograd gets None; .grad is set from main_grad below).
        grads, targets, accumulated = [], {}, []
        for n, p, need in zip(ctx.names, params, needs):
            if need and p.dtype == torch.bfloat16:
                targets[n] = main_grad(p)
                accumulated.append(p)
                grads.append(None)
            elif need:
                grads.append(torch.zeros(p.shape, dtype=_gradient_dtype(ctx.rows[n], layer_dtype)))
                targets[n] = grads[-1]
            else:
                grads.append(None)
        dx = torch.zeros_like(x) if ctx.needs_input_grad[2] else None
        views = {n: (g.data_ptr(), tuple(g.shape)) for n, g in targets.items()}
        pending, ctx.pending = ctx.pending, None
        if pending is None:
            # A second backward through a retained graph (retain_graph=True, gradcheck): mlacp's forward state is
            # consumed by its backward, so the forward runs again on the same (version-checked) x and weights.
            pending, _ = ctx.layer.forward(x.data_ptr(), tuple(x.shape), ctx.flags, ctx.cu_seqlens)
        pending.backward(dy.data_ptr(), tuple(dy.shape), views, 0 if dx is None else dx.data_ptr(),
                         tuple(x.shape))
        for p in accumulated:
            publish_grad(p)
        return (None, None, dx, *grads)


class MlaAttention(torch.nn.Module):
    """Multi-head Latent Attention (docs/spec.md) on a Ulysses group: ``forward(x_local)`` with x_local ``[B, s, D]``
    (this rank's contiguous token shard, s = ``local_seq``: the first S mod P ranks hold ceil(S/P) tokens, the others
    floor(S/P)) returns y_local ``[B, s, D]``.

    Any batch and length per call: S is the sum of the ranks' shards (``token_map_for(S)`` says which tokens each
    rank brings). The configuration's batch and seq are optional maxima: 0 (unset) takes any shape; set, they bound
    every call.

    Arguments: ``config`` an mlacp.MlaConfig, ``mesh`` an mlacp.Mesh, ``dtype`` of the
    parameters: torch.float32, torch.float64 or torch.bfloat16, ``seed`` (every rank draws the same weights from it:
    nn.Linear's uniform(+-1/sqrt(in)) for the weights and biases, ones for the RMSNorm gains g_kv and g_q (q-LoRA);
    drawn in float64 and rounded to ``dtype``), ``bias`` (overrides config.bias when given), ``compute_dtype`` (None,
    or torch.bfloat16 with float32 parameters: see below). Construction is collective. ``module.config`` is a
    read-only copy (the C++ layer's configuration is fixed at construction).

    Weight gradients are this rank's partial sums (docs/spec.md); ``mlacp.all_reduce_grads(module)`` sums them over the
    mesh. Errors (wrong shape, dtype, device, a non-contiguous tensor) are raised as mlacp.InvalidArgument (a
    ValueError) on every rank of a checked mesh.

    bfloat16 (mixed precision). The C++ layer of bf16 keeps x, y, dx, the activations and what goes on the wire in
    bf16 and accumulates in float (GEMMs, softmax statistics, RMSNorm, the reduce-scatter's sums); it writes the weight
    gradients in float (the parameter table's gradient type 'accumulation'). Two ways to run it:

    * bf16 parameters, ``dtype=torch.bfloat16``: x must be bf16 (float x too under autocast, cast as torch's layers
      cast), y is bf16; neither is copied (y is the layer's output memory, x its input). A bf16 Parameter's ``.grad``
      is bf16 in torch, but summing micro-batches' gradients in bf16 would round at every step; so, as Megatron does
      with its float master gradients, each bf16 parameter gets a float32 accumulator ``param.main_grad`` (allocated
      at its first backward) that the C++ backward adds into, and ``.grad`` is set to main_grad rounded to bf16
      after every backward (in place when it exists). A plain torch optimizer on ``.grad`` works, and
      ``optimizer.zero_grad()`` (to None or to zero), clipping or replacing ``.grad`` are seen: whenever ``.grad`` is
      not what mlacp last wrote, main_grad restarts from ``.grad``. Read main_grad for the unrounded sum (e.g. for a
      float master copy of the weights); write ``.grad``, not main_grad. all_reduce_grads sums main_grad (in float)
      and rounds again. The autograd engine gets no gradient for these parameters (mlacp sets ``.grad`` itself), so
      tensor hooks registered on them do not run.
    * float parameters computed in bf16 (the autocast way): ``compute_dtype=torch.bfloat16``, or no compute_dtype and
      a forward under ``torch.autocast("cpu", dtype=torch.bfloat16)``. Each forward casts the weights into bf16
      copies the module owns (allocated at the first such forward and reused; skipped while no weight changed), takes
      x in float32 (cast to bf16, a copy, as autocast casts) or bf16 (not copied), and returns y in bf16 as torch's
      own layers do under autocast. The float weight gradients go straight into the float parameters' ``.grad``
      (no bf16 rounding). Outside autocast and without compute_dtype a float module runs in float as before.

    Threads: one host thread at a time per mesh, and per communicator (every mesh, and every layer, over the same
    mpi4py communicator): mlacp releases the GIL in forward and backward, and a second thread entering meanwhile
    raises mlacp.UsageError ("another thread is inside mlacp on this communicator"). A rank that fails in forward or
    backward (after the ranks agreed on the arguments) breaks the mesh: every rank raises mlacp.CommunicationError
    naming it, and every later call on that mesh raises too.
    """

    def __init__(self, config, mesh, dtype=torch.float32, seed=0, bias=None, compute_dtype=None):
        super().__init__()
        config = _mlacp.MlaConfig(config)
        if bias is not None:
            config.bias = bool(bias)
        error = ""
        if dtype not in _LAYERS:
            error = f"mlacp.MlaAttention: dtype {dtype}; expected {_DTYPES}"
        elif compute_dtype not in (None, dtype) and not (dtype == torch.float32 and compute_dtype == torch.bfloat16):
            error = (f"mlacp.MlaAttention: compute_dtype {compute_dtype} with parameters of dtype {dtype}; expected "
                     f"None, the parameters' dtype, or torch.bfloat16 with torch.float32 parameters")
        mesh.agree("mlacp.MlaAttention", error, [("dtype (bytes per value)", _dtype_code(dtype)),
                                                 ("compute_dtype (bytes per value)", _dtype_code(compute_dtype)),
                                                 ("seed", seed)])
        self._config = FrozenConfig(config)
        self.mesh = mesh
        self._compute_dtype = None if compute_dtype == dtype else compute_dtype
        if config.error(mesh.size):
            _LAYERS[dtype](config, mesh, {})  # the library's message, raised on every rank
            raise _mlacp.InvalidArgument(f"mlacp.MlaAttention: {config.error(mesh.size)}")
        rows = [row for row in parameter_table(config) if row.present]
        shapes = {row.name: row.shape for row in rows}
        generator = torch.Generator().manual_seed(seed)
        for row in rows:
            if row.kind == "norm_gain":
                value = torch.ones(row.shape, dtype=torch.float64)
            else:
                # nn.Linear's: a bias takes the fan-in of its weight (b_q: w_q's, or w_qb's with q-LoRA).
                fan_in = shapes[_bias_weight(row.name, shapes)][1] if row.kind == "bias" else row.shape[1]
                bound = 1.0 / math.sqrt(fan_in)
                value = torch.empty(row.shape, dtype=torch.float64).uniform_(-bound, bound, generator=generator)
            self.register_parameter(row.name, torch.nn.Parameter(value.to(dtype)))
        self._flags = tuple(row.flag for row in rows)
        self._names = tuple(row.name for row in rows)
        # The C++ layers, by what they run over: ("params", dtype) wraps the parameters' storage, ("cast", dtype) the
        # module's copies of the weights in that dtype (self._copies). _layer: the one the last call used.
        self._layers = {}
        self._copies = {}
        self._layer = None
        # Collective: the library checks the configuration (and these weights) on every rank now, not at the first
        # forward.
        params = tuple(getattr(self, n) for n in self._names)
        self._layer_for(params, self._layer_dtype(dtype))

    @property
    def config(self):
        """The configuration, read-only (assigning a field raises): the C++ layer copied it at construction."""
        return self._config

    @config.setter
    def config(self, value):
        raise AttributeError("mlacp.MlaAttention: config cannot be assigned: the configuration is fixed at "
                             "construction (build a new MlaAttention for another configuration)")

    @property
    def local_seq(self):
        """This rank's token count s of the configuration's S (``local_seq_for(S)`` for any other): on a flat mesh
        the first S mod P ranks hold ceil(S/P) tokens, the others floor(S/P); on a two-level mesh, its ranges of
        ``token_map``."""
        mesh = self.mesh
        return self.token_map.count(mesh.ring_rank, mesh.ulysses_rank)

    @property
    def token_map(self):
        """Which global tokens each rank holds of the configuration's S (mlacp.TokenMap of the mesh and the
        configuration's ring layout; ``token_map_for(S)`` for any other S): x and dy are this rank's tokens of it
        (``token_map.shard(x, mesh)``), y and dx come back in it."""
        return TokenMap.of(self.mesh, self.config.seq, self.config.ring_layout)

    def token_map_for(self, seq):
        """The token map of a call of ``seq`` tokens: any S per call (the configuration's seq, when set, bounds it).
        Each rank brings its shard ``token_map_for(S).shard(x, mesh)``; the layer derives S from the ranks' shards."""
        return TokenMap.of(self.mesh, seq, self.config.ring_layout)

    def local_seq_for(self, seq):
        """This rank's token count in a call of ``seq`` tokens."""
        mesh = self.mesh
        return self.token_map_for(seq).count(mesh.ring_rank, mesh.ulysses_rank)

    @property
    def dtype(self):
        """The parameters' dtype."""
        names = getattr(self, "_names", ())
        return getattr(self, names[0]).dtype if names else None

    @property
    def compute_dtype(self):
        """The constructor's compute_dtype (None: the parameters' dtype, or bf16 under CPU autocast)."""
        return self._compute_dtype

    def extra_repr(self):
        compute = "" if self._compute_dtype is None else f", compute_dtype={self._compute_dtype}"
        return f"{self.config.describe()}, P={self.mesh.size}, dtype={self.dtype}{compute}"

    def load_deepseek_state_dict(self, state_dict, prefix="", rope_interleave=None, checkpoint_format="auto"):
        """Loads a DeepSeek-V2/V3 attention state_dict (HF ``DeepseekV3Attention``'s keys after ``prefix``, e.g.
        ``"model.layers.0.self_attn."``: q_proj or q_a_proj / q_a_layernorm / q_b_proj, kv_a_proj_with_mqa,
        kv_a_layernorm, kv_b_proj, o_proj; mlacp.deepseek has the table) into this module's parameters, in place (as
        load_state_dict). A missing or unexpected key, or a wrong shape, raises mlacp.InvalidArgument naming it.
        Checkpoints whose RoPE rotates interleaved pairs (DeepSeek's: ``config.rope_interleave``, True in a config
        from ``MlaConfig.from_hf_config``; the ``rope_interleave`` argument overrides it) have their rope rows
        permuted into docs/spec.md's rotate-half order. DeepSeek's inference format (wq_a, q_norm, wkv_a, ...,
        ``checkpoint_format`` "inference", or "auto" from the keys) loads too, and fp8 weights with their block
        scales (V3 as released) are dequantised (mlacp.from_deepseek_state_dict)."""
        self.load_state_dict(
            from_deepseek_state_dict(state_dict, self.config, prefix, rope_interleave, checkpoint_format))

    def deepseek_state_dict(self, prefix="", rope_interleave=None, checkpoint_format="hf"):
        """This module's parameters under DeepSeek-V2/V3's attention keys (the inverse of load_deepseek_state_dict;
        detached tensors, copies where ``rope_interleave`` permutes rows; ``checkpoint_format`` "hf" or
        "inference")."""
        own = {n: p.detach() for n, p in self.named_parameters()}
        return to_deepseek_state_dict(own, self.config, prefix, rope_interleave, checkpoint_format)

    def forward(self, x, cu_seqlens=None):
        """y_local for x_local ``[B, s, D]``. ``cu_seqlens`` (optional): this batch's packed documents, the offsets
        ``[0, e_1, ..., S]`` over the global sequence (a list, tuple, 1-D integer tensor or array), the same on every
        rank, in place of the configuration's (which is fixed at construction); every call may pass another packing.
        It is checked and agreed by every rank in the call's own agreement, and allocates nothing after the first
        call while it has at most ``config.max_documents`` documents. Computed in bf16 (y in bf16, x cast from float
        if need be) with compute_dtype=torch.bfloat16 or under torch.autocast("cpu", dtype=torch.bfloat16); see the
        class docstring."""
        with self.mesh._entered("mlacp.MlaAttention.forward"):  # one thread at a time, the agreements included
            offsets, self._offsets_error = _offsets(cu_seqlens)
            params = tuple(getattr(self, n) for n in self._names)
            layer_dtype = self._layer_dtype(params[0].dtype)
            cast_x = layer_dtype == torch.bfloat16 and (params[0].dtype == torch.float32 or _autocast_bf16())
            if (cast_x and isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.device.type == "cpu"):
                x = x.to(torch.bfloat16, memory_format=torch.contiguous_format)  # autograd takes dx back to float
            return _MlaFunction.apply(self, offsets, x, *params)

    def _layer_dtype(self, param_dtype):
        """The value type the C++ layer runs in for parameters of ``param_dtype``: bf16 for float32 parameters with
        compute_dtype bf16 or under CPU autocast to bf16, else the parameters' own."""
        if param_dtype == torch.float32 and (self._compute_dtype == torch.bfloat16 or
                                             (self._compute_dtype is None and _autocast_bf16())):
            return torch.bfloat16
        return param_dtype

    def _cast_weights(self, params, dtype):
        """The module's ``dtype`` copies of ``params`` (allocated once), holding the parameters' current values: cast
        again when any parameter's storage or version changed since the last cast."""
        copies = self._copies.get(dtype)
        if copies is None or any(c.shape != p.shape for c, p in zip(copies[0], params)):
            copies = (tuple(torch.empty(p.shape, dtype=dtype) for p in params), None)
        stamp = tuple((p.data_ptr(), p.dtype, p._version) for p in params)
        if copies[1] != stamp:
            with torch.no_grad():
                for c, p in zip(copies[0], params):
                    c.copy_(p)
            copies = (copies[0], stamp)
        self._copies[dtype] = copies
        return copies[0]

    def _layer_key(self, params, layer_dtype):
        """(the key of the C++ layer for a call, whether that layer has to be built)."""
        if layer_dtype == params[0].dtype:
            key, storage = ("params", layer_dtype), tuple((p.data_ptr(), p.dtype) for p in params)
        else:
            copies = self._copies.get(layer_dtype)
            key, storage = ("cast", layer_dtype), None if copies is None else tuple(
                (c.data_ptr(), c.dtype) for c in copies[0])
        held = self._layers.get(key)
        return key, storage is None or held is None or held[0] != storage

    def _layer_for(self, params, layer_dtype):
        """The C++ layer of ``layer_dtype`` for ``params``: over their storage, or over the module's copies of them
        (cast first); a new one (collective) when that storage changed."""
        key, _ = self._layer_key(params, layer_dtype)
        tensors = params if key[0] == "params" else self._cast_weights(params, layer_dtype)
        storage = tuple((t.data_ptr(), t.dtype) for t in tensors)
        held = self._layers.get(key)
        if held is None or held[0] != storage:
            views = {n: (t.data_ptr(), tuple(t.shape)) for n, t in zip(self._names, tensors)}
            self._layer = None
            self._layers.pop(key, None)
            if key[0] == "params":  # a layer over storage the parameters no longer have is of no further use
                for stale in [k for k in self._layers if k[0] == "params"]:
                    del self._layers[stale]
            self._layers[key] = (storage, _LAYERS[layer_dtype](self._config, self.mesh, views))
        self._layer = self._layers[key][1]
        return self._layer

    def _prepare(self, x, params, needs_grad):
        """Checks x and the parameters (every rank agrees on the verdict, the dtypes and whether the layer is
        rebuilt), then returns the C++ layer and the gradient flags."""
        where = "mlacp.MlaAttention.forward"
        dtype = params[0].dtype
        layer_dtype = self._layer_dtype(dtype)
        error = "" if dtype in _LAYERS else (f"{where}: parameter {self._names[0]} has dtype {dtype}; expected "
                                             f"{_DTYPES}")
        shapes = parameter_shapes(self._config)
        for name, p in zip(self._names, params):
            error = error or _tensor_error(where, f"parameter {name}", p, dtype, len(shapes[name]))
        why = ("the dtype of the layer's parameters" if layer_dtype == dtype else
               f"the dtype the layer computes in, for {dtype} parameters; {dtype} x is cast to it")
        error = error or _tensor_error(where, "x", x, layer_dtype, 3, why)
        error = error or getattr(self, "_offsets_error", "")  # forward's cu_seqlens that are no offsets
        rebuild = self._layer_key(params, layer_dtype)[1] if not error else False
        self.mesh.agree(where, error, [("dtype (bytes per value)", _dtype_code(dtype)),
                                       ("compute dtype (bytes per value; bf16 under autocast)",
                                        _dtype_code(layer_dtype)),
                                       ("parameter storage replaced since the last call", int(rebuild))])
        layer = self._layer_for(params, layer_dtype)
        flags = _mlacp.MlaRequiresGrad.none()
        flags.x = bool(needs_grad[0])
        for flag, need in zip(self._flags, needs_grad[1:]):
            setattr(flags, flag, bool(need))
        return layer, flags
