# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp's parameter table from Python: the parameters of a configuration, their shapes, flags and gradient types,
as the C++ library registers them (mlacp/mla/parameter_table.hpp). The module and the DeepSeek name map both read
it; it imports nothing of theirs.
"""
import collections

from . import _mlacp


class ParameterRow(collections.namedtuple("ParameterRow", "name shape present flag kind gradient")):
    """One row of mlacp's parameter table (mlacp/mla/parameter_table.hpp) for a configuration: ``name`` (attribute,
    state_dict key), ``shape``, ``present`` (whether the configuration has it: biases only with config.bias),
    ``flag`` (the MlaRequiresGrad field of its gradient), ``kind`` ('weight', 'bias' or 'norm_gain') and
    ``gradient`` (its gradient's value type: 'weight', the weight's dtype)."""


def parameter_table(config):
    """The C++ library's parameter table for ``config``: a ParameterRow per parameter, in registration order."""
    return [ParameterRow(*row) for row in _mlacp.parameter_table(config)]


# docs/spec.md's weights, in the order the module registers them (and the state_dict lists them): the C++ table's.
PARAMETER_NAMES = tuple(row.name for row in parameter_table(_mlacp.MlaConfig()))
BIAS_NAMES = tuple(row.name for row in parameter_table(_mlacp.MlaConfig()) if row.kind == "bias")


def parameter_shapes(config):
    """{name: shape} of docs/spec.md's weights for ``config`` (those it has: biases only with config.bias)."""
    return {row.name: row.shape for row in parameter_table(config) if row.present}
