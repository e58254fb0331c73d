// Pins the Prometheus Operator whose CRDs (example/prometheus-operator-crd/ in its module) the chart's
// monitoring tests install: tests/chart/operator.py downloads the module through the Go module proxy.
// Nothing compiles here.
module topolet.io/tests/chart/prometheus-operator

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
