// Bad input to the CPU kernels throws an exception naming the argument.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "decode_case.hpp"
#include "phasekv/attention/cpu/decode.hpp"
#include "phasekv/attention/cpu/prefill.hpp"
#include "phasekv/attention/cpu/thread_driver.hpp"

namespace {

namespace cpu = phasekv::cpu;

template <class F>
void expect_throw_naming(F&& f, const std::string& name) {
  try {
    f();
    ADD_FAILURE() << "no exception, expected one naming " << name;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos)
        << "message '" << e.what() << "' does not name " << name;
  }
}

TEST(CpuErrors, DecodeArguments) {
  pkt::DecodeCase<float> c({100, 2, 3, 64, 64, 8, 4, 0, 16}, 3);
  {
    auto a = c.args;
    a.q = nullptr;
    expect_throw_naming([&] { cpu::decode(a); }, "q = null");
  }
  {
    auto a = c.args;
    a.out = nullptr;
    expect_throw_naming([&] { cpu::decode(a); }, "out = null");
  }
  {
    auto a = c.args;
    a.lse = nullptr;
    expect_throw_naming([&] { cpu::decode(a); }, "lse = null");
  }
  {
    auto a = c.args;
    a.q_heads = 5;
    expect_throw_naming([&] { cpu::decode(a); }, "q_heads = 5");
  }
  {
    auto a = c.args;
    a.kv_heads = 0;
    expect_throw_naming([&] { cpu::decode(a); }, "kv_heads = 0");
  }
  {
    auto a = c.args;
    a.kv.segments[1].keys.dim = 32;  // segment shape mismatch
    expect_throw_naming([&] { cpu::decode(a); }, "keys.dim");
  }
  {
    auto a = c.args;
    a.kv.segments[0].values.heads = 3;
    expect_throw_naming([&] { cpu::decode(a); }, "values.heads");
  }
  {
    auto a = c.args;
    a.kv.segments[0].values.tokens += 1;
    expect_throw_naming([&] { cpu::decode(a); }, "values.tokens");
  }
  {
    auto a = c.args;
    a.kv.segments[0].keys.data = nullptr;
    expect_throw_naming([&] { cpu::decode(a); }, "keys");
  }
  {
    auto a = c.args;
    a.variant.softcap = -1.0f;
    expect_throw_naming([&] { cpu::decode(a); }, "variant.softcap");
  }
  std::vector<unsigned char> ws(cpu::decode_workspace_size(c.args, 2));
  expect_throw_naming([&] { cpu::decode_partition(c.args, ws.data(), ws.size(), 2, 2); },
                      "thread_index = 2");
  expect_throw_naming([&] { cpu::decode_partition(c.args, ws.data(), ws.size(), 0, 0); },
                      "thread_count = 0");
  expect_throw_naming([&] { cpu::decode_partition(c.args, ws.data(), ws.size() - 1, 0, 2); },
                      "workspace_bytes");
  expect_throw_naming([&] { cpu::decode_partition(c.args, nullptr, ws.size(), 0, 2); },
                      "workspace = null");
  expect_throw_naming([&] { cpu::decode_merge(c.args, ws.data(), ws.size(), 3); },
                      "workspace_bytes");
  expect_throw_naming([&] { cpu::decode_workspace_size(c.args, 0); }, "partitions = 0");
  expect_throw_naming([&] { cpu::ThreadPool p(0); }, "threads = 0");
  expect_throw_naming([&] { cpu::ThreadPool p(2, -1); }, "spin_us = -1");
}

TEST(CpuErrors, PrefillArguments) {
  std::vector<float> rk(100 * 2 * 16), q(10 * 4 * 16), out(10 * 4 * 16), lse(40);
  cpu::PrefillArgs<float> a;
  a.q = q.data();
  a.num_queries = 10;
  a.q_heads = 4;
  a.kv_heads = 2;
  a.d_k = 16;
  a.d_v = 16;
  a.first = 90;
  a.raw_k = phasekv::make_view<const float>(rk.data(), 100, 2, 16);
  a.raw_v = a.raw_k;
  a.out = out.data();
  a.lse = lse.data();
  cpu::prefill(a);  // valid
  {
    auto b = a;
    b.first = 91;
    expect_throw_naming([&] { cpu::prefill(b); }, "raw_k.tokens");
  }
  {
    auto b = a;
    b.rule = cpu::VisibilityRule::compressed(phasekv::Geometry(4, 4), 8);
    expect_throw_naming([&] { cpu::prefill(b); }, "entry_k");
  }
  {
    auto b = a;
    b.q_heads = 3;
    expect_throw_naming([&] { cpu::prefill(b); }, "q_heads = 3");
  }
  {
    auto b = a;
    b.raw_v.dim = 8;
    expect_throw_naming([&] { cpu::prefill(b); }, "raw_v.dim");
  }
  {
    auto b = a;
    b.out = nullptr;
    expect_throw_naming([&] { cpu::prefill(b); }, "out = null");
  }
  expect_throw_naming([&] { cpu::prefill_partition(a, 1, 1); }, "thread_index = 1");
  expect_throw_naming([&] { cpu::VisibilityRule::sliding_window(0); }, "window = 0");
  expect_throw_naming([&] { cpu::VisibilityRule::compressed(phasekv::Geometry(4, 4), -1); },
                      "local = -1");
}

}  // namespace
