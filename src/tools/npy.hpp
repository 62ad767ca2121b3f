// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// A minimal .npy (NumPy format 1.0) writer: little-endian, C order, float32, float64 or int64.
#pragma once

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp::tools {

template <class T>
void write_npy(const std::string& path, const std::vector<T>& data, const std::vector<std::size_t>& shape) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t>,
                "write_npy: float, double or int64");
  std::string dims;
  std::size_t count = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    count *= shape[i];
  }
  if (count != data.size())
    throw std::invalid_argument("write_npy: " + path + " has " + std::to_string(data.size()) +
                                " values for a shape of " + std::to_string(count));
  std::string header = std::string("{'descr': '") +
                       (std::is_same_v<T, float>    ? "<f4"
                        : std::is_same_v<T, double> ? "<f8"
                                                    : "<i8") +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // magic (6) + version (2) + header length (2) + header + '\n', padded with spaces to a multiple of 64.
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) throw std::runtime_error("write_npy: cannot open " + path);
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(magic, 8);
  const auto length = static_cast<std::uint16_t>(header.size());
  const char length_bytes[2] = {static_cast<char>(length & 0xff), static_cast<char>(length >> 8)};
  out.write(length_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(T)));
  if (!out) throw std::runtime_error("write_npy: writing " + path + " failed");
}

}  // namespace mlacp::tools
