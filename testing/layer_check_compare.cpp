// The layer check, compare side: what the GPU wrote against the CPU reference (double
// precision). Integer data exactly; outputs and gradients by relative Frobenius error on
// sampled tokens, experts and FFN rows; every output also for leftover poison (NaN).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "host_data.hpp"
#include "layer_check_detail.hpp"
#include "reference/reference.hpp"

namespace moeblaze::detail {
namespace {

bool is_nan_bf16(bf16 v) { return (v.bits & 0x7f80) == 0x7f80 && (v.bits & 0x7f) != 0; }

template <class T>
std::vector<T> download(const DeviceBuffer& b, size_t count, size_t offset_bytes = 0) {
  std::vector<T> v(count);
  b.download(v.data(), count * sizeof(T), offset_bytes);
  return v;
}
template <class T>
std::vector<T> download_ptr(CUdeviceptr p, size_t count) {
  std::vector<T> v(count);
  if (count) MB_CU(cuda_driver().cuMemcpyDtoH(v.data(), p, count * sizeof(T)));
  return v;
}

double rel_error_bf16(const std::vector<bf16>& got, const std::vector<double>& ref) {
  std::vector<double> g(got.size());
  for (size_t i = 0; i < got.size(); ++i) g[i] = to_float(got[i]);
  return reference::relative_error(g.data(), ref.data(), g.size());
}

template <class T>
bool has_poison(const std::vector<T>& v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return std::any_of(v.begin(), v.end(), is_nan_bf16);
  } else {
    return std::any_of(v.begin(), v.end(), [](float f) { return std::isnan(f); });
  }
}

void note_unwritten(LayerCheckResult& res, const std::string& name, bool bad) {
  if (!bad) return;
  res.all_written = false;
  res.unwritten += (res.unwritten.empty() ? "" : ", ") + name;
}

reference::ExpertWeights expert_weights(const CheckData& c) {
  const bool bias = c.options.layer.expert_bias;
  return {c.in.w1.data(), c.gated ? c.in.w3.data() : nullptr, c.in.w2.data(), c.E, c.d, c.n,
          c.options.layer.activation, bias ? c.in.b_up.data() : nullptr, bias ? c.in.b_down.data() : nullptr};
}

reference::RouterSpec router_spec(const CheckData& c) {
  const LayerConfig& l = c.options.layer;
  return {l.router, l.renormalize, l.route_scale};
}

// The tokens with a left-out pick (LayerCheckOptions::bad_ids), ascending.
std::vector<int64_t> bad_tokens(const CheckData& c) {
  std::set<int64_t> t;
  for (const auto& [slot, id] : c.options.bad_ids) t.insert(slot / c.K);
  return {t.begin(), t.end()};
}

bool is_bad_slot(const CheckData& c, int64_t slot) {
  for (const auto& [s, id] : c.options.bad_ids)
    if (s == slot) return true;
  return false;
}

// Rows t of a [T, width] array, for the sampled tokens.
template <class V>
V rows_of(const V& all, const std::vector<int64_t>& tokens, int64_t width) {
  V out;
  for (int64_t t : tokens) out.insert(out.end(), all.begin() + t * width, all.begin() + (t + 1) * width);
  return out;
}

// A left-out slot's gate gradient must be exactly 0 (the reference, which has the pick with
// gate 0, gives <dy, o> there): compared on a line of its own, the other slots as usual.
void compare_d_topk_weights(const CheckData& c, const std::vector<float>& dgates_gpu,
                            const reference::TokenGrads& tg, const std::vector<int64_t>& tokens,
                            LayerCheckResult& res) {
  note_unwritten(res, "d_topk_weights", has_poison(dgates_gpu));
  std::vector<double> got, ref;
  for (size_t i = 0; i < tokens.size(); ++i)
    for (int j = 0; j < c.K; ++j) {
      const int64_t slot = tokens[i] * c.K + j;
      if (is_bad_slot(c, slot)) continue;
      got.push_back(dgates_gpu[slot]);
      ref.push_back(tg.d_gates[i * c.K + j]);
    }
  res.errors.push_back({"d_topk_weights", reference::relative_error(got.data(), ref.data(), got.size()),
                        static_cast<int64_t>(got.size()), false});
  if (c.options.bad_ids.empty()) return;
  bool zero = true;
  for (const auto& [slot, id] : c.options.bad_ids) zero &= dgates_gpu[slot] == 0.f;
  res.errors.push_back({"d_topk_weights of left-out slots are 0", zero ? 0.0 : 1.0,
                        static_cast<int64_t>(c.options.bad_ids.size()), true});
}

// The relative error of rows `which` (tokens with a left-out pick) of `got` [tokens, width]
// against `ref`, where `tokens` lists the rows' tokens: a line of their own, so that a few
// wrong rows are not averaged away among the sampled tokens.
void compare_bad_token_rows(const CheckData& c, const std::string& name, const std::vector<bf16>& got,
                            const std::vector<double>& ref, const std::vector<int64_t>& tokens, int64_t width,
                            LayerCheckResult& res) {
  const std::vector<int64_t> bad = bad_tokens(c);
  if (bad.empty()) return;
  std::vector<bf16> g;
  std::vector<double> r;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (std::binary_search(bad.begin(), bad.end(), tokens[i])) {
      g.insert(g.end(), got.begin() + i * width, got.begin() + (i + 1) * width);
      r.insert(r.end(), ref.begin() + i * width, ref.begin() + (i + 1) * width);
    }
  res.errors.push_back({name + " (tokens with a left-out pick)", rel_error_bf16(g, r), static_cast<int64_t>(g.size()),
                        false});
}

void compare_dx(const CheckData& c, const std::vector<int32_t>& ids, const std::vector<double>& logits,
                const reference::TokenGrads& tg, const std::vector<int64_t>& tokens, LayerCheckResult& res) {
  std::vector<double> ref = tg.dx;
  if (c.router) {
    // Router part of dx for the sampled tokens, from the reference gate gradients.
    const std::vector<double> lg_rows = rows_of(logits, tokens, c.E);
    const std::vector<int32_t> ids_rows = rows_of(ids, tokens, c.K);
    const int64_t ns = static_cast<int64_t>(tokens.size());
    const auto dl =
        reference::router_logits_grad(router_spec(c), lg_rows.data(), ids_rows.data(), tg.d_gates.data(), ns, c.E, c.K);
    std::vector<int64_t> rows(ns);
    std::iota(rows.begin(), rows.end(), 0);
    const auto rdx = reference::router_dx_rows(dl.data(), c.in.wr.data(), c.E, c.d, rows);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += rdx[i];
  }
  const auto dx_gpu = download<bf16>(c.buf.dx, c.T * c.d);
  note_unwritten(res, "dx", has_poison(dx_gpu));
  const std::vector<bf16> got = rows_of(dx_gpu, tokens, c.d);
  res.errors.push_back({"dx", rel_error_bf16(got, ref), static_cast<int64_t>(got.size()), false});
  compare_bad_token_rows(c, "dx", got, ref, tokens, c.d, res);
}

// Experts whose weight gradients are compared: the busiest, the least busy non-empty one,
// random ones, and an expert without tokens (its gradient must be exactly zero) when there is one.
std::set<int> sample_experts(const CheckData& c, const std::vector<int64_t>& count) {
  std::set<int> experts;
  experts.insert(static_cast<int>(std::max_element(count.begin(), count.end()) - count.begin()));
  int least = -1;
  for (int e = 0; e < c.E; ++e)
    if (count[e] > 0 && (least < 0 || count[e] < count[least])) least = e;
  experts.insert(least);
  for (uint64_t i = 0; static_cast<int>(experts.size()) < std::min(c.options.sample_experts, c.E); ++i)
    experts.insert(static_cast<int>(unit_double(c.options.seed * 16 + 14, i) * c.E));
  for (int e = 0; e < c.E; ++e)
    if (count[e] == 0) {
      experts.insert(e);
      break;
    }
  return experts;
}

// FFN rows compared per expert: all of them for small n, else a sample (first and last in).
std::vector<int> sample_ffn_rows(const CheckData& c) {
  std::vector<int> rows;
  if (c.n <= 128) {
    for (int i = 0; i < c.n; ++i) rows.push_back(i);
  } else {
    std::set<int> r = {0, c.n - 1};
    for (uint64_t i = 0; r.size() < 64; ++i) r.insert(static_cast<int>(unit_double(c.options.seed * 16 + 15, i) * c.n));
    rows.assign(r.begin(), r.end());
  }
  return rows;
}

// `count` gradient elements from `offset` of a weight-gradient buffer, as doubles: bf16
// values, or with fp32 accumulation what was added to the initial contents.
std::vector<double> gradient(const CheckData& c, const DeviceBuffer& b, const std::vector<float>& init, size_t offset,
                             size_t count, LayerCheckResult& res) {
  std::vector<double> g(count);
  if (c.options.accumulate_fp32) {
    const auto v = download<float>(b, count, offset * 4);
    for (size_t i = 0; i < count; ++i) g[i] = static_cast<double>(v[i]) - init[offset + i];
    note_unwritten(res, "weight gradients", has_poison(v));
  } else {
    const auto v = download<bf16>(b, count, offset * 2);
    for (size_t i = 0; i < count; ++i) g[i] = to_float(v[i]);
    note_unwritten(res, "weight gradients", has_poison(v));
  }
  return g;
}

void compare_weight_grads(const CheckData& c, const std::vector<int32_t>& ids, const std::vector<double>& gates,
                          LayerCheckResult& res) {
  std::vector<int64_t> count(c.E, 0);
  for (int32_t e : ids) ++count[e];
  const std::set<int> experts = sample_experts(c, count);
  const std::vector<int> rows = sample_ffn_rows(c);
  const int64_t R = static_cast<int64_t>(rows.size());
  const reference::ExpertWeights rw = expert_weights(c);
  const size_t nd = static_cast<size_t>(c.n) * c.d;
  auto append = [](std::vector<double>& a, const std::vector<double>& b) { a.insert(a.end(), b.begin(), b.end()); };
  const bool bias = c.options.layer.expert_bias;
  // Bias gradients add from zero under fp32 accumulation (their contents are not initialised).
  const std::vector<float> zero_up(c.in.b_up.size(), 0.f), zero_down(c.in.b_down.size(), 0.f);
  const size_t gn = static_cast<size_t>(c.options.layer.gate_parts()) * c.n;
  std::vector<double> got1, ref1, got3, ref3, got2, ref2, got_bu, ref_bu, got_bd, ref_bd;
  std::string names;
  for (int e : experts) {
    if (!names.empty()) names += ",";
    names += std::to_string(e);
    const auto eg = reference::expert_weight_grad_rows(rw, c.in.x.data(), c.in.dy.data(), ids.data(), gates.data(),
                                                       c.T, c.K, e, rows);
    const size_t w1_e = e * c.w1_rows * c.d;  // expert e's first dW1 element
    for (int i : rows) {  // rows i of dW1 and dW3 (fused: dW3 is rows n + i of dW1)
      append(got1, gradient(c, c.buf.dw1, c.in.acc1, w1_e + static_cast<size_t>(i) * c.d, c.d, res));
      if (c.separate_w3)
        append(got3, gradient(c, c.buf.dw3, c.in.acc3, e * nd + static_cast<size_t>(i) * c.d, c.d, res));
      if (c.fused) append(got3, gradient(c, c.buf.dw1, c.in.acc1, w1_e + static_cast<size_t>(c.n + i) * c.d, c.d, res));
    }
    append(ref1, eg.dw1);
    if (c.gated) append(ref3, eg.dw3);
    if (bias) {  // the expert's bias gradients: its sampled rows of d_bias_up, all of d_bias_down
      for (int part = 0; part < c.options.layer.gate_parts(); ++part)
        for (int i : rows) append(got_bu, gradient(c, c.buf.db_up, zero_up, e * gn + part * c.n + i, 1, res));
      append(ref_bu, eg.d_bias_up);
      append(got_bd, gradient(c, c.buf.db_down, zero_down, static_cast<size_t>(e) * c.d, c.d, res));
      append(ref_bd, eg.d_bias_down);
    }
    // Columns i of dW2 [d, n]: read whole rows, keep the sampled columns.
    const auto w2e = gradient(c, c.buf.dw2, c.in.acc2, e * nd, nd, res);
    for (int64_t col = 0; col < c.d; ++col)
      for (int64_t r = 0; r < R; ++r) got2.push_back(w2e[col * c.n + rows[r]]);
    append(ref2, eg.dw2);
    if (count[e] == 0) {  // exact zeros expected
      const auto g1 = gradient(c, c.buf.dw1, c.in.acc1, w1_e, c.w1_rows * c.d, res);  // fused: dW3 too
      const bool zero = std::all_of(g1.begin(), g1.end(), [](double v) { return v == 0.0; }) &&
                        std::all_of(w2e.begin(), w2e.end(), [](double v) { return v == 0.0; });
      res.errors.push_back({fmt::format("dW1, dW2 of empty expert {} are zero", e), zero ? 0.0 : 1.0,
                            static_cast<int64_t>(2 * nd), true});
    }
  }
  names += fmt::format("; {} of {} rows", R, c.n);
  auto line = [&](const std::string& name, const std::vector<double>& got, const std::vector<double>& ref) {
    res.errors.push_back({name + " (experts " + names + ")", reference::relative_error(got.data(), ref.data(), got.size()),
                          static_cast<int64_t>(got.size()), false});
  };
  line("dW1", got1, ref1);
  if (c.gated) line("dW3", got3, ref3);
  line("dW2", got2, ref2);
  if (bias) {
    line("d_bias_up", got_bu, ref_bu);
    line("d_bias_down", got_bd, ref_bd);
  }
}

// dW_r over all tokens, from the GPU's gate gradients (themselves compared before).
void compare_router_wgrad(const CheckData& c, const std::vector<int32_t>& ids, const std::vector<double>& logits,
                          const std::vector<float>& dgates_gpu, LayerCheckResult& res) {
  const std::vector<double> dg(dgates_gpu.begin(), dgates_gpu.end());
  const auto dl = reference::router_logits_grad(router_spec(c), logits.data(), ids.data(), dg.data(), c.T, c.E, c.K);
  const auto ref = reference::router_weight_grad(dl.data(), c.in.x.data(), c.T, c.E, c.d);
  std::vector<double> got(static_cast<size_t>(c.E) * c.d);
  if (c.options.accumulate_fp32) {
    const auto v = download<float>(c.buf.dwr, got.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = static_cast<double>(v[i]) - c.in.accr[i];
  } else {
    const auto v = download<bf16>(c.buf.dwr, got.size());
    note_unwritten(res, "dw_router", has_poison(v));
    for (size_t i = 0; i < got.size(); ++i) got[i] = to_float(v[i]);
  }
  res.errors.push_back({"dW_router", reference::relative_error(got.data(), ref.data(), got.size()),
                        static_cast<int64_t>(got.size()), false});
}

}  // namespace

// With bad_ids: the arrays of build_index_left_out of what the GPU got; expert_token_indices
// only where a slot is in (the positions after the last one are not written).
std::vector<int32_t> compare_left_out_index_arrays(const CheckData& c, LayerCheckResult& res) {
  const ForwardState& st = c.state;
  const int64_t TK = c.T * c.K;
  const reference::IndexArrays ref = reference::build_index_left_out(c.in.device_ids.data(), c.T, c.K, c.E);
  const int32_t in = ref.expert_token_offsets[c.E];
  const std::vector<int32_t> eti = download_ptr<int32_t>(st.expert_token_indices, in);
  const bool same = std::equal(eti.begin(), eti.end(), ref.expert_token_indices.begin()) &&
                    ref.expert_token_offsets == download_ptr<int32_t>(st.expert_token_offsets, c.E + 1) &&
                    ref.token_expert_indices == download_ptr<int32_t>(st.token_expert_indices, TK) &&
                    ref.token_index_map == download_ptr<int32_t>(st.token_index_map, TK);
  res.errors.push_back({"index arrays (left-out slots: kLeftOutSlot)", same ? 0.0 : 1.0, TK * 2 + in + c.E + 1, true});
  const auto counts = download_ptr<int32_t>(st.expert_counts, c.E);
  bool counts_ok = true;
  for (int e = 0; e < c.E; ++e) counts_ok &= counts[e] == ref.expert_token_offsets[e + 1] - ref.expert_token_offsets[e];
  res.errors.push_back({"expert counts (left-out slots in none)", counts_ok ? 0.0 : 1.0, c.E, true});
  const auto [mn, mx] = std::minmax_element(counts.begin(), counts.end());
  res.expert_counts_min_max = {*mn, *mx};
  return c.in.ids;  // the reference's routing: every pick, the left-out ones with gate 0
}

std::vector<int32_t> compare_index_arrays(const CheckData& c, LayerCheckResult& res) {
  if (!c.options.bad_ids.empty()) return compare_left_out_index_arrays(c, res);
  const ForwardState& st = c.state;
  const int64_t TK = c.T * c.K;
  const std::vector<int32_t> ids = download_ptr<int32_t>(st.token_expert_indices, TK);
  const reference::IndexArrays ref = reference::build_index(ids.data(), c.T, c.K, c.E);
  const bool same = ref.expert_token_indices == download_ptr<int32_t>(st.expert_token_indices, TK) &&
                    ref.expert_token_offsets == download_ptr<int32_t>(st.expert_token_offsets, c.E + 1) &&
                    ref.token_expert_indices == ids &&
                    ref.token_index_map == download_ptr<int32_t>(st.token_index_map, TK);
  res.errors.push_back({"index arrays", same ? 0.0 : 1.0, TK * 3 + c.E + 1, true});
  const auto counts = download_ptr<int32_t>(st.expert_counts, c.E);
  bool counts_ok = true;
  for (int e = 0; e < c.E; ++e) counts_ok &= counts[e] == ref.expert_token_offsets[e + 1] - ref.expert_token_offsets[e];
  res.errors.push_back({"expert counts", counts_ok ? 0.0 : 1.0, c.E, true});
  const auto [mn, mx] = std::minmax_element(counts.begin(), counts.end());
  res.expert_counts_min_max = {*mn, *mx};
  return ids;
}

std::vector<double> compare_router(const CheckData& c, const std::vector<int32_t>& ids, std::vector<double>& logits,
                                   LayerCheckResult& res) {
  const int64_t T = c.T, TK = c.T * c.K;
  const int E = c.E, K = c.K;
  std::vector<double> gates_ref(TK);
  if (!c.router) {
    for (int64_t i = 0; i < TK; ++i) gates_ref[i] = c.in.gates[i];
    return gates_ref;
  }
  const LayerConfig& l = c.options.layer;
  logits = reference::router_logits(c.in.x.data(), c.in.wr.data(), T, c.d, E);
  gates_ref = reference::gates_for(router_spec(c), logits.data(), ids.data(), T, E, K);
  const auto gates_gpu = download<float>(c.buf.gates_out, TK);
  note_unwritten(res, "gates", has_poison(gates_gpu));
  const std::vector<double> g(gates_gpu.begin(), gates_gpu.end());
  res.errors.push_back({"gates", reference::relative_error(g.data(), gates_ref.data(), TK), TK, false});
  // Picks: every picked key at least every unpicked key (up to GPU logit rounding).
  int64_t wrong = 0;
  for (int64_t t = 0; t < T; ++t) {
    const double* lg = logits.data() + t * E;
    double mx = -INFINITY, sum = 0;
    for (int e = 0; e < E; ++e) mx = std::max(mx, lg[e]);
    for (int e = 0; e < E; ++e) sum += std::exp(lg[e] - mx);
    auto key = [&](int e) {
      return l.router == RouterKind::softmax_topk
                 ? std::exp(lg[e] - mx) / sum
                 : 1.0 / (1.0 + std::exp(-lg[e])) + (c.in.bias.empty() ? 0.0 : c.in.bias[e]);
    };
    double min_picked = INFINITY, max_other = -INFINITY;
    std::set<int> picked(ids.begin() + t * K, ids.begin() + (t + 1) * K);
    for (int e = 0; e < E; ++e)
      (picked.count(e) ? min_picked = std::min(min_picked, key(e)) : max_other = std::max(max_other, key(e)));
    if (min_picked < max_other - 1e-4 * std::max(1.0, std::abs(max_other))) ++wrong;
  }
  res.errors.push_back({"router picks", wrong ? static_cast<double>(wrong) / T : 0.0, T, true});
  return gates_ref;
}

std::vector<int64_t> sample_tokens(const CheckData& c) {
  const int64_t T = c.T;
  std::vector<int64_t> tokens;
  if (T <= c.options.sample_tokens) {
    tokens.resize(T);
    std::iota(tokens.begin(), tokens.end(), 0);
    return tokens;
  }
  std::set<int64_t> pick = {0, T - 1};
  for (int64_t t : bad_tokens(c)) pick.insert(t);
  for (uint64_t i = 0; static_cast<int>(pick.size()) < c.options.sample_tokens; ++i)
    pick.insert(static_cast<int64_t>(unit_double(c.options.seed * 16 + 13, i) * T));
  tokens.assign(pick.begin(), pick.end());
  return tokens;
}

void compare_forward(const CheckData& c, const std::vector<int32_t>& ids, const std::vector<double>& gates,
                     const std::vector<int64_t>& tokens, LayerCheckResult& res) {
  const auto y_gpu = download<bf16>(c.buf.y, c.T * c.d);
  note_unwritten(res, "y", has_poison(y_gpu));
  const auto ref = reference::forward_rows(expert_weights(c), c.in.x.data(), ids.data(), gates.data(), c.K, tokens);
  const std::vector<bf16> got = rows_of(y_gpu, tokens, c.d);
  res.errors.push_back({"y", rel_error_bf16(got, ref), static_cast<int64_t>(got.size()), false});
  compare_bad_token_rows(c, "y", got, ref, tokens, c.d, res);
}

void compare_backward(const CheckData& c, const std::vector<int32_t>& ids, const std::vector<double>& gates,
                      const std::vector<double>& logits, const std::vector<int64_t>& tokens, LayerCheckResult& res) {
  const auto tg = reference::backward_rows(expert_weights(c), c.in.x.data(), c.in.dy.data(), ids.data(), gates.data(),
                                           c.K, tokens);
  const auto dgates_gpu = download<float>(c.buf.dgates, c.T * c.K);
  compare_d_topk_weights(c, dgates_gpu, tg, tokens, res);
  compare_dx(c, ids, logits, tg, tokens, res);
  compare_weight_grads(c, ids, gates, res);
  if (c.router) compare_router_wgrad(c, ids, logits, dgates_gpu, res);
}

}  // namespace moeblaze::detail
