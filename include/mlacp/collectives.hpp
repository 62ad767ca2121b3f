// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The communication core: mesh, handles, partitions and the three collectives (even and uneven).
#pragma once

#include <mlacp/all_gather.hpp>
#include <mlacp/all_to_all.hpp>
#include <mlacp/async_collective.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/partition.hpp>
#include <mlacp/progress.hpp>
#include <mlacp/reduce_scatter.hpp>
#include <mlacp/send_recv.hpp>
