#include "attention_templates/Reference.h"

#include <Eigen/Core>
#include <cmath>

#include "ir/IR.h"

namespace flextile::attention {

using dsl::DType;
using dsl::Tensor;

std::vector<double> toDoubles(const Tensor& t) {
  auto widen = [](const auto& v) { return std::vector<double>(v.begin(), v.end()); };
  switch (t.dtype()) {
    case DType::F32: return widen(t.toHost<float>());
    case DType::F64: return t.toHost<double>();
    case DType::F16: {
      auto v = t.toHost<Eigen::half>();
      std::vector<double> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = double(float(v[i]));
      return out;
    }
    case DType::BF16: {
      auto v = t.toHost<Eigen::bfloat16>();
      std::vector<double> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = double(float(v[i]));
      return out;
    }
    default: throw Error("toDoubles: expected a float tensor, got " + t.describe());
  }
}

ReferenceResult referenceAttention(const Tensor& q, const Tensor& k, const Tensor& v, const RefScoreFn& score,
                                   const RefMaskFn& mask, double scale, int64_t qOffset) {
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const std::vector<double> qd = toDoubles(q), kd = toDoubles(k), vd = toDoubles(v);
  ReferenceResult r;
  r.out.assign(size_t(B * Hq * L * D), 0.0);
  r.lse.assign(size_t(B * Hq * L), -INFINITY);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      Eigen::Map<const Mat> Q(qd.data() + (b * Hq + h) * L * D, L, D);
      Eigen::Map<const Mat> K(kd.data() + (b * Hkv + hk) * S * D, S, D);
      Eigen::Map<const Mat> V(vd.data() + (b * Hkv + hk) * S * D, S, D);
      Mat s = (Q * K.transpose()) * scale;
      Eigen::Map<Mat> O(r.out.data() + (b * Hq + h) * L * D, L, D);
      for (int64_t i = 0; i < L; ++i) {
        double m = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          const bool ok = !mask || mask(b, h, i + qOffset, j);
          if (ok) ++r.allowedPairs;
          double x = ok ? (score ? score(s(i, j), b, h, i + qOffset, j) : s(i, j)) : -INFINITY;
          s(i, j) = x;
          m = std::max(m, x);
        }
        if (m == -INFINITY) continue;  // no allowed key: out 0, lse -inf
        double l = 0;
        for (int64_t j = 0; j < S; ++j) l += s(i, j) = std::exp(s(i, j) - m);
        O.row(i) = (s.row(i) * V) / l;
        r.lse[size_t((b * Hq + h) * L + i)] = m + std::log(l);
      }
    }
  return r;
}

ReferenceGrads referenceAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                          const RefScoreFn& score, const RefScoreGradFn& scoreGrad,
                                          const RefMaskFn& mask, double scale, int64_t qOffset,
                                          const std::vector<double>* dlse, const RefScoreGradSink& sink,
                                          const Tensor* out) {
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const std::vector<double> qd = toDoubles(q), kd = toDoubles(k), vd = toDoubles(v), dod = toDoubles(dout);
  const std::vector<double> od = out ? toDoubles(*out) : std::vector<double>();
  ReferenceGrads g;
  g.dq.assign(size_t(B * Hq * L * D), 0.0);
  g.dk.assign(size_t(B * Hkv * S * D), 0.0);
  g.dv.assign(size_t(B * Hkv * S * D), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      Eigen::Map<const Mat> Q(qd.data() + (b * Hq + h) * L * D, L, D);
      Eigen::Map<const Mat> dO(dod.data() + (b * Hq + h) * L * D, L, D);
      Eigen::Map<const Mat> K(kd.data() + (b * Hkv + hk) * S * D, S, D);
      Eigen::Map<const Mat> V(vd.data() + (b * Hkv + hk) * S * D, S, D);
      Eigen::Map<Mat> dQ(g.dq.data() + (b * Hq + h) * L * D, L, D);
      Eigen::Map<Mat> dK(g.dk.data() + (b * Hkv + hk) * S * D, S, D);
      Eigen::Map<Mat> dV(g.dv.data() + (b * Hkv + hk) * S * D, S, D);
      const Mat s = (Q * K.transpose()) * scale;
      const Mat dP = dO * V.transpose();
      Mat P = Mat::Zero(L, S), dS = Mat::Zero(L, S);
      for (int64_t i = 0; i < L; ++i) {
        double m = -INFINITY;
        std::vector<char> ok(static_cast<size_t>(S));
        for (int64_t j = 0; j < S; ++j) {
          ok[size_t(j)] = !mask || mask(b, h, i + qOffset, j);
          const double x = ok[size_t(j)] ? (score ? score(s(i, j), b, h, i + qOffset, j) : s(i, j)) : -INFINITY;
          P(i, j) = x;
          m = std::max(m, x);
        }
        if (m == -INFINITY) {  // no allowed key: the row's gradients are 0
          P.row(i).setZero();
          continue;
        }
        double l = 0;
        for (int64_t j = 0; j < S; ++j) l += P(i, j) = ok[size_t(j)] ? std::exp(P(i, j) - m) : 0.0;
        P.row(i) /= l;
        double delta = 0;
        if (out)
          for (int64_t d = 0; d < D; ++d)
            delta += od[size_t(((b * Hq + h) * L + i) * D + d)] * dod[size_t(((b * Hq + h) * L + i) * D + d)];
        else
          delta = P.row(i).dot(dP.row(i));
        if (dlse) delta -= (*dlse)[size_t((b * Hq + h) * L + i)];
        for (int64_t j = 0; j < S; ++j) {
          if (!ok[size_t(j)]) continue;
          const double gOut = P(i, j) * (dP(i, j) - delta);
          if (sink) sink(gOut, s(i, j), b, h, i + qOffset, j);
          dS(i, j) = gOut * (scoreGrad ? scoreGrad(s(i, j), b, h, i + qOffset, j) : 1.0);
        }
      }
      dQ += scale * dS * K;
      dK += scale * dS.transpose() * Q;
      dV += P.transpose() * dO;
    }
  return g;
}

}  // namespace flextile::attention
