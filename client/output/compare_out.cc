#include "output/json_out.h"
#include "output/text_out.h"

namespace trainwatch::cli {

void WriteCompare(JsonWriter& w, const v1::CompareRunsResponse& r) {
  w.BeginObject();
  w.Key("run");
  w.String(r.run_id());
  w.Key("attempt");
  w.Uint(r.attempt());
  w.Key("refs");
  w.BeginArray();
  for (const v1::BaselineRef& ref : r.refs()) w.String(BaselineRefText(ref));
  w.EndArray();
  w.Key("metric");
  w.String(r.metric());
  w.Key("axis");
  w.String(r.axis());
  w.Key("bins");
  w.BeginArray();
  for (const v1::CompareBin& b : r.bins()) {
    w.BeginObject();
    w.Key("x");
    w.Double(b.x());
    w.Key("first_step");
    w.Uint(b.first_step());
    w.Key("last_step");
    w.Uint(b.last_step());
    w.Key("value");
    w.Double(b.value());
    w.Key("ref_median");
    w.Double(b.ref_median());
    w.Key("lo");
    w.Double(b.lo());
    w.Key("hi");
    w.Double(b.hi());
    w.Key("z");
    w.Double(b.z());
    w.Key("outside");
    w.Bool(b.value() < b.lo() || b.value() > b.hi());
    if (b.has_lr_ratio()) {
      w.Key("lr_ratio");
      w.Double(b.lr_ratio());
    }
    w.EndObject();
  }
  w.EndArray();
  w.Key("left_band");
  w.Bool(r.left_band());
  w.Key("first_step_outside");
  if (r.left_band()) {
    w.Uint(r.first_step_outside());
  } else {
    w.Null();
  }
  w.Key("band_half_width");
  w.Double(r.band_half_width());
  w.EndObject();
}

}  // namespace trainwatch::cli
