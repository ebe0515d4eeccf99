// The texts the deploy files and docs repeat from the alert catalog
// (health/alert_catalog.h), printed from it: `trainwatch-server
// --print-catalog rules|inhibit|docs|charts|json`. Each but json
// is a block, its BEGIN and END marker lines included, that stands verbatim
// in the file it belongs to; tests/deploy/catalog_files_test.py regenerates
// them and fails on any difference.
#ifndef TRAINWATCH_SERVER_HEALTH_CATALOG_PRINT_H_
#define TRAINWATCH_SERVER_HEALTH_CATALOG_PRINT_H_

#include <optional>
#include <string>
#include <string_view>

namespace trainwatch {

// The per-alert rules of deploy/prometheus/trainwatch-rules.yml's group
// trainwatch-detectors, every alert but the kCustom ones, in catalog order.
std::string PrintAlertRules();

// deploy/alertmanager/alertmanager.yml's inhibit rules from the catalog's
// causes: one rule per consequence, muted while one of its causes fires for
// the same run (AlertRule::inhibits says which causes mute).
std::string PrintInhibitRules();

// The alert table of README.md and docs/detectors.md (markdown).
std::string PrintAlertTable();

// The HTML report's map from an alert to the charts it is shaded on
// (client/report/report.cc: the client does not link the catalog).
std::string PrintChartMap();

// Every entry as JSON (name, severity, scope, rule kind, causes, likely_cause,
// fix), for the tests that check the hand-written rules against it.
std::string PrintCatalogJson();

// "rules", "inhibit", "docs", "charts" or "json": that text; nullopt for another name.
std::optional<std::string> PrintCatalog(std::string_view what);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_CATALOG_PRINT_H_
