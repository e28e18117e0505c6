// Command kuberl-fake-gpu is a DRA driver for the local cluster's real node: it publishes fake GPUs in a
// ResourceSlice, each with the standard resource.kubernetes.io/pcieRoot attribute, and prepares the claims the
// scheduler allocates from them, so that pods whose ResourceClaims the operator rendered can start. It touches no
// device: preparing a claim hands the kubelet the allocated devices and no CDI edits.
//
// The GPUs are split in order over the PCIe roots given: with 8 GPUs and two roots, gpu-0 to gpu-3 sit under the
// first, gpu-4 to gpu-7 under the second (as on a two-socket server).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

const pcieRootAttribute = "resource.kubernetes.io/pcieRoot"

// fakeGPUs are the driver's devices: claims are prepared without touching any.
type fakeGPUs struct {
	driver string
}

// devices lists `count` GPUs named gpu-<i>, in order over `roots`, each with an index, a model and 80Gi of memory.
func devices(count int, roots []string) []resourceapi.Device {
	out := make([]resourceapi.Device, 0, count)
	perRoot := (count + len(roots) - 1) / len(roots)
	for i := 0; i < count; i++ {
		root, index, model := roots[i/perRoot], int64(i), "kuberl-fake-gpu"
		out = append(out, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				pcieRootAttribute: {StringValue: &root},
				"index":           {IntValue: &index},
				"model":           {StringValue: &model},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: resource.MustParse("80Gi")},
			},
		})
	}
	return out
}

// PrepareResourceClaims returns, for each claim, the devices of this driver that its allocation names.
func (f *fakeGPUs) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		var prepared []kubeletplugin.Device
		if claim.Status.Allocation == nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)}
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver == f.driver {
				prepared = append(prepared, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
			}
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: prepared}
	}
	return out, nil
}

// UnprepareResourceClaims has nothing to undo.
func (f *fakeGPUs) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		out[claim.UID] = nil
	}
	return out, nil
}

// HandleError logs what the helper's background work reports.
func (f *fakeGPUs) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

// WatchHealthStatus reports nothing: fake devices stay healthy.
func (f *fakeGPUs) WatchHealthStatus(ctx context.Context, _ chan<- kubeletplugin.DeviceHealthReport) error {
	<-ctx.Done()
	return nil
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the driver's client")
	node := flag.String("node-name", "", "the node whose GPUs these are")
	driver := flag.String("driver-name", "fake-gpu.kuberl.io", "the DRA driver name (DeviceClass selectors match it)")
	kubeletDir := flag.String("kubelet-root-dir", "/var/lib/kubelet", "the kubelet's --root-dir")
	count := flag.Int("gpus", 8, "how many GPUs to publish")
	rootList := flag.String("pcie-roots", "pci0000:00,pci0000:80", "PCIe roots, comma-separated; GPUs are split over them in order")
	flag.Parse()
	roots := strings.Split(*rootList, ",")
	if *node == "" || *count < 1 || len(roots) == 0 {
		fmt.Fprintln(os.Stderr, "error: --node-name, --gpus >= 1 and --pcie-roots are needed")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: kubeconfig %s: %v\n", *kubeconfig, err)
		os.Exit(1)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: client: %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	plugins := filepath.Join(*kubeletDir, "plugins", *driver)
	if err := os.MkdirAll(plugins, 0o750); err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		os.Exit(1)
	}
	helper, err := kubeletplugin.Start(ctx, &fakeGPUs{driver: *driver},
		kubeletplugin.DriverName(*driver), kubeletplugin.NodeName(*node), kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(*kubeletDir, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(plugins))
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: starting the plugin: %v\n", err)
		os.Exit(1)
	}
	slice := resourceslice.Slice{Devices: devices(*count, roots)}
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{*node: {Slices: []resourceslice.Slice{slice}}}}
	if err := helper.PublishResources(ctx, resources); err != nil {
		fmt.Fprintf(os.Stderr, "error: publishing the ResourceSlice: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %d fake GPUs on %s over %s\n", *driver, *count, *node, *rootList)
	<-ctx.Done()
	helper.Stop()
}
