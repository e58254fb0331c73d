// nri-runtime: the runtime side of NRI from NRI itself (github.com/containerd/nri pkg/adaptation, the
// library containerd embeds), driving one external plugin for topolet's tests and bench; and, with
// -plugin, a reference plugin built on NRI's own Go stub (pkg/stub).
//
// Runtime mode listens on -socket, prints {"event":"listening"}, waits for a plugin to register and
// synchronize, sends -creates CreateContainer requests (then one UpdateContainer, StopContainer and
// RemoveContainer), optionally waits for the plugin's UpdateContainers, and prints one JSON object a
// line: each answer as protojson, then {"event":"timing"} with the CreateContainer round trips as
// the runtime measured them.  It exits when done, which closes the plugin's connection.
//
// With -script the runtime instead reads one JSON command a line from stdin and answers each with
// {"event":"reply","seq":N,...} (see runScript); plugins may connect, leave and reconnect at any
// time, and each plugin's Synchronize is printed as {"event":"Synchronize",...} when it happens.
// It exits at the end of stdin.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

var out = json.NewEncoder(os.Stdout)
var outLock sync.Mutex

func emit(fields map[string]any) {
	outLock.Lock()
	defer outLock.Unlock()
	if err := out.Encode(fields); err != nil {
		fmt.Fprintln(os.Stderr, "nri-runtime: writing stdout:", err)
		os.Exit(1)
	}
}

func asJSON(m proto.Message) json.RawMessage {
	if m == nil {
		return json.RawMessage("null")
	}
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		fail("protojson: %v", err)
	}
	return b
}

func updatesJSON(updates []*api.ContainerUpdate) []json.RawMessage {
	list := []json.RawMessage{}
	for _, u := range updates {
		list = append(list, asJSON(u))
	}
	return list
}

func fail(format string, args ...any) {
	emit(map[string]any{"event": "error", "error": fmt.Sprintf(format, args...)})
	os.Exit(1)
}

// The pods and containers Synchronize reports; -sync-bytes adds padded pods, each with a container,
// so that the request exceeds ttrpc's 4 MiB and the runtime splits it (SynchronizeRequest.more).
// (Pods and containers grow together: v0.12.3's split loop never ends when the containers per
// message round down to zero while some remain, e.g. one container beside >4 MiB of pods.)
func existing(syncBytes int) ([]*api.PodSandbox, []*api.Container) {
	pods := []*api.PodSandbox{{Id: "pod0", Name: "web", Uid: "uid-0", Namespace: "default"}}
	containers := []*api.Container{{
		Id: "ctr0", PodSandboxId: "pod0", Name: "app", State: api.ContainerState_CONTAINER_RUNNING,
		Linux: &api.LinuxContainer{Resources: &api.LinuxResources{Cpu: &api.LinuxCPU{Cpus: "0-3"}}},
	}}
	const padding = 4096
	for i := 1; syncBytes > 0; i++ {
		pods = append(pods, &api.PodSandbox{
			Id: fmt.Sprintf("pod%d", i), Name: fmt.Sprintf("filler-%d", i), Namespace: "default",
			Annotations: map[string]string{"pad": strings.Repeat("x", padding/2)},
		})
		containers = append(containers, &api.Container{
			Id: fmt.Sprintf("filler-ctr%d", i), PodSandboxId: fmt.Sprintf("pod%d", i), Name: "app",
			State:       api.ContainerState_CONTAINER_RUNNING,
			Annotations: map[string]string{"pad": strings.Repeat("x", padding/2)},
		})
		syncBytes -= padding
	}
	return pods, containers
}

func newPod() *api.PodSandbox {
	return &api.PodSandbox{Id: "pod1", Name: "guaranteed", Uid: "uid-1", Namespace: "default",
		Labels: map[string]string{"app": "bench"}}
}

func newContainer(i int) *api.Container {
	return &api.Container{
		Id: fmt.Sprintf("ctr%d", i), PodSandboxId: "pod1", Name: "main",
		State: api.ContainerState_CONTAINER_CREATED,
		Args:  []string{"/bin/sleep", "infinity"}, Env: []string{"PATH=/usr/bin:/bin"},
		Linux: &api.LinuxContainer{
			CgroupsPath: "/kubepods/pod-uid-1/ctr",
			Resources: &api.LinuxResources{
				Cpu:    &api.LinuxCPU{Shares: api.UInt64(2048), Quota: api.Int64(200000), Period: api.UInt64(100000), Cpus: "0-3"},
				Memory: &api.LinuxMemory{Limit: api.Int64(1 << 30)},
			},
		},
	}
}

// startAdaptation starts NRI's runtime side listening on socket (plugin folders under dir, empty).
func startAdaptation(socket, dir string, syncFn adaptation.SyncFn, updateFn adaptation.UpdateFn) *adaptation.Adaptation {
	r, err := adaptation.New("nri-runtime", "v0.12.3", syncFn, updateFn,
		adaptation.WithSocketPath(socket),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")))
	if err != nil {
		fail("adaptation: %v", err)
	}
	if err := r.Start(); err != nil {
		fail("start: %v", err)
	}
	return r
}

func percentile(sorted []time.Duration, p float64) float64 {
	idx := int(float64(len(sorted)-1) * p)
	return float64(sorted[idx].Nanoseconds()) / 1e3
}

func runRuntime(socket string, creates, syncBytes int, waitUpdates time.Duration) {
	dir, err := os.MkdirTemp("", "nri-runtime-")
	if err != nil {
		fail("temp dir: %v", err)
	}
	defer os.RemoveAll(dir)

	synced := make(chan struct{})
	updates := make(chan []*api.ContainerUpdate, 1)
	var listening atomic.Bool
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		if !listening.Load() {
			return nil // Start's sync of pre-installed plugins: there are none
		}
		pods, containers := existing(syncBytes)
		upd, err := cb(ctx, pods, containers)
		if err != nil {
			return err
		}
		emit(map[string]any{"event": "Synchronize", "pods": len(pods), "containers": len(containers),
			"update": updatesJSON(upd)})
		close(synced)
		return nil
	}
	updateFn := func(_ context.Context, upd []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
		updates <- upd
		return nil, nil
	}
	r := startAdaptation(socket, dir, syncFn, updateFn)
	listening.Store(true)
	emit(map[string]any{"event": "listening", "socket": socket})

	select {
	case <-synced:
	case <-time.After(30 * time.Second):
		fail("no plugin registered and synchronized within 30 s")
	}
	// The plugin joins the runtime's list right after its sync; this waits for that.
	r.BlockPluginSync().Unblock()

	ctx := context.Background()
	pod := newPod()
	rtts := make([]time.Duration, 0, creates)
	for i := 1; i <= creates; i++ {
		req := &api.CreateContainerRequest{Pod: pod, Container: newContainer(i)}
		start := time.Now()
		rpl, err := r.CreateContainer(ctx, req)
		rtts = append(rtts, time.Since(start))
		if err != nil {
			fail("CreateContainer %d: %v", i, err)
		}
		if i == 1 {
			emit(map[string]any{"event": "CreateContainer", "response": asJSON(rpl)})
		}
	}
	container := newContainer(1)
	urpl, err := r.UpdateContainer(ctx, &api.UpdateContainerRequest{Pod: pod, Container: container,
		LinuxResources: &api.LinuxResources{Cpu: &api.LinuxCPU{Shares: api.UInt64(4096)}}})
	if err != nil {
		fail("UpdateContainer: %v", err)
	}
	emit(map[string]any{"event": "UpdateContainer", "response": asJSON(urpl)})
	srpl, err := r.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: container})
	if err != nil {
		fail("StopContainer: %v", err)
	}
	emit(map[string]any{"event": "StopContainer", "response": asJSON(srpl)})
	if err := r.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: container}); err != nil {
		fail("RemoveContainer: %v", err)
	}
	emit(map[string]any{"event": "RemoveContainer"})
	if err := r.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: newPod()}); err != nil {
		fail("RunPodSandbox: %v", err)
	}
	emit(map[string]any{"event": "RunPodSandbox"})

	if waitUpdates > 0 {
		select {
		case upd := <-updates:
			emit(map[string]any{"event": "UpdateContainers", "update": updatesJSON(upd)})
		case <-time.After(waitUpdates):
			fail("no UpdateContainers from the plugin within %s", waitUpdates)
		}
	}

	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	if len(rtts) > 0 {
		emit(map[string]any{"event": "timing", "creates": len(rtts), "p50_us": percentile(rtts, 0.50),
			"p99_us": percentile(rtts, 0.99), "max_us": percentile(rtts, 1.0)})
	}
	emit(map[string]any{"event": "done"})
}

// scriptCommand is one line of -script input.  Pods and containers are protojson (proto or JSON
// field names), as `existing` (what Synchronize reports to the next plugin that connects) or as the
// subject of create, update, stop and remove.
type scriptCommand struct {
	Seq        int               `json:"seq"`
	Op         string            `json:"op"`
	Pods       []json.RawMessage `json:"pods"`
	Containers []json.RawMessage `json:"containers"`
	Pod        json.RawMessage   `json:"pod"`
	Container  json.RawMessage   `json:"container"`
	Resources  json.RawMessage   `json:"resources"`
}

func unmarshal(raw json.RawMessage, m proto.Message) error {
	if len(raw) == 0 {
		return nil
	}
	return protojson.Unmarshal(raw, m)
}

func runScript(socket string) {
	dir, err := os.MkdirTemp("", "nri-runtime-")
	if err != nil {
		fail("temp dir: %v", err)
	}
	defer os.RemoveAll(dir)

	var existingLock sync.Mutex
	var existingPods []*api.PodSandbox
	var existingContainers []*api.Container
	var listening atomic.Bool
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		if !listening.Load() {
			return nil
		}
		existingLock.Lock()
		pods, containers := existingPods, existingContainers
		existingLock.Unlock()
		upd, err := cb(ctx, pods, containers)
		if err != nil {
			emit(map[string]any{"event": "Synchronize", "error": err.Error()})
			return err
		}
		emit(map[string]any{"event": "Synchronize", "pods": len(pods), "containers": len(containers),
			"update": updatesJSON(upd)})
		return nil
	}
	updateFn := func(_ context.Context, upd []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
		emit(map[string]any{"event": "UpdateContainers", "update": updatesJSON(upd)})
		return nil, nil
	}
	r := startAdaptation(socket, dir, syncFn, updateFn)
	listening.Store(true)
	emit(map[string]any{"event": "listening", "socket": socket})

	ctx := context.Background()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		var cmd scriptCommand
		if err := json.Unmarshal(in.Bytes(), &cmd); err != nil {
			fail("script: %v", err)
		}
		reply := map[string]any{"event": "reply", "seq": cmd.Seq, "op": cmd.Op}
		pod, container := &api.PodSandbox{}, &api.Container{}
		if err := unmarshal(cmd.Pod, pod); err != nil {
			fail("script pod: %v", err)
		}
		if err := unmarshal(cmd.Container, container); err != nil {
			fail("script container: %v", err)
		}
		// As containerd does around container operations: no plugin joins halfway through one.
		block := r.BlockPluginSync()
		start := time.Now()
		var opErr error
		switch cmd.Op {
		case "existing":
			pods, containers := []*api.PodSandbox{}, []*api.Container{}
			for _, raw := range cmd.Pods {
				p := &api.PodSandbox{}
				if err := unmarshal(raw, p); err != nil {
					fail("script existing pod: %v", err)
				}
				pods = append(pods, p)
			}
			for _, raw := range cmd.Containers {
				c := &api.Container{}
				if err := unmarshal(raw, c); err != nil {
					fail("script existing container: %v", err)
				}
				containers = append(containers, c)
			}
			existingLock.Lock()
			existingPods, existingContainers = pods, containers
			existingLock.Unlock()
		case "create":
			rpl, err := r.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: container})
			opErr = err
			reply["response"] = asJSON(rpl)
		case "update":
			res := &api.LinuxResources{}
			if err := unmarshal(cmd.Resources, res); err != nil {
				fail("script resources: %v", err)
			}
			rpl, err := r.UpdateContainer(ctx, &api.UpdateContainerRequest{Pod: pod, Container: container,
				LinuxResources: res})
			opErr = err
			reply["response"] = asJSON(rpl)
		case "stop":
			rpl, err := r.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: container})
			opErr = err
			reply["response"] = asJSON(rpl)
		case "remove":
			opErr = r.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: container})
		default:
			fail("script: unknown op %q", cmd.Op)
		}
		reply["us"] = float64(time.Since(start).Nanoseconds()) / 1e3
		block.Unblock()
		if opErr != nil {
			reply["error"] = opErr.Error()
		}
		emit(reply)
	}
	r.Stop()
	emit(map[string]any{"event": "done"})
}

// referencePlugin answers CreateContainer with the same adjustment as the Python test handler.
type referencePlugin struct{}

func (referencePlugin) CreateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adjust := &api.ContainerAdjustment{}
	adjust.SetLinuxCPUSetCPUs("2-3")
	adjust.SetLinuxCPUSetMems("0")
	return adjust, nil, nil
}

func (referencePlugin) RemoveContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}

func runPlugin(socket string) {
	s, err := stub.New(referencePlugin{}, stub.WithPluginName("reference"), stub.WithPluginIdx("10"),
		stub.WithSocketPath(socket))
	if err != nil {
		fail("stub: %v", err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	// Returns once the runtime goes away.
	_ = s.Run(ctx)
}

func main() {
	socket := flag.String("socket", "", "the NRI socket to listen on (runtime) or dial (-plugin)")
	plugin := flag.Bool("plugin", false, "run NRI's Go stub as a reference plugin instead of the runtime")
	creates := flag.Int("creates", 1, "CreateContainer requests to send")
	syncBytes := flag.Int("sync-bytes", 0, "pad Synchronize's pods by about this many bytes")
	waitUpdates := flag.Duration("wait-updates", 0, "wait this long for the plugin's UpdateContainers")
	script := flag.Bool("script", false, "take commands from stdin, one JSON object a line (runScript)")
	flag.Parse()
	if *socket == "" {
		fail("-socket is required")
	}
	if *plugin {
		runPlugin(*socket)
		return
	}
	if *script {
		runScript(*socket)
		return
	}
	runRuntime(*socket, *creates, *syncBytes, *waitUpdates)
}
