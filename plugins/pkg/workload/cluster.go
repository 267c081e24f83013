package workload

import (
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/contract"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/facts"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/fwk"
	"github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/sharing"
)

// Placed is what one node's GPU pods add to the cluster's figures: their GPUs, the
// CPU and memory beside them, their shapes, and their demand restricted to products.
type Placed struct {
	Model     string // the node's GPU model ("" : unknown)
	Allocated int64  // its allocatable GPUs, counted in its model's capacity
	CPUMilli  int64  // requested by its GPU pods
	RAMMiB    int64
	Shapes    []Shape
	// Classes: what its pods ask of GPUs, per container share and per pod asking
	// whole GPUs (the share mix).
	Classes []ClassKey
	// Demand, in GPUs, of its pods restricted to products (each pod's GPUs split evenly
	// over its products), and of all its GPU pods; a share counts as its units over
	// those of one GPU of the node (a whole GPU where they are unknown).
	Demand      map[string]float64
	DemandTotal float64
}

// Requests is a pod's CPU (millicores) and memory (MiB) as kube-scheduler sums them,
// each rounded down and clamped, as the extender reads them.
func Requests(pod *v1.Pod) (int64, int64) {
	return requestsIn(resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{}))
}

// requestsIn is Requests from the pod's summed requests.
func requestsIn(requests v1.ResourceList) (int64, int64) {
	cpu, ram := requests[v1.ResourceCPU], requests[v1.ResourceMemory]
	return facts.Down(&cpu, 1000, 0), facts.Down(&ram, 1, 20)
}

// Read is a node's Placed, from its facts and its pods.
func Read(node *facts.Node, pods []fwk.PodInfo) *Placed {
	return place(node, pods, ReadPod)
}

// PodRead is what the figures take of one pod: its GPUs and shares, the CPU and memory
// beside them, the products it is restricted to, its shape.
type PodRead struct {
	Gpus     int64
	Shares   []int64
	CPUMilli int64
	RAMMiB   int64
	Products []string
	Grid     Shape // its shape without products (the share mix's grid)
	Shape    Shape
}

// ReadPod reads a pod for the figures (nil: it asks no GPU).
func ReadPod(pod *v1.Pod) *PodRead {
	requests := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{}) // summed once
	gpu := requests[v1.ResourceName(contract.ResourceGpu)]
	gpus := gpu.Value() // as facts.GpuRequest reads it
	shares, _ := facts.PodShares(pod)
	if gpus <= 0 && len(shares) == 0 {
		return nil
	}
	cpu, ram := requestsIn(requests)
	restricted, _ := facts.Products(pod.Annotations) // unreadable: not restricted
	products := facts.SortedProducts(restricted)
	return &PodRead{Gpus: gpus, Shares: shares, CPUMilli: cpu, RAMMiB: ram, Products: products,
		Grid: ShapeOf(gpus, cpu, ram, nil), Shape: ShapeOf(gpus, cpu, ram, products)}
}

// place adds up a node's pods as read.
func place(node *facts.Node, pods []fwk.PodInfo, read func(*v1.Pod) *PodRead) *Placed {
	out := &Placed{Model: node.Model, Allocated: node.Allocatable}
	units := sharing.Units(node.MemoryMiB, 0)
	for _, info := range pods {
		pod := read(info.GetPod())
		if pod == nil {
			continue
		}
		out.CPUMilli += pod.CPUMilli
		out.RAMMiB += pod.RAMMiB
		for _, share := range pod.Shares {
			out.Classes = append(out.Classes, ClassKey{"share", share, pod.Grid.CPUMilli, pod.Grid.RAMMiB})
		}
		demand := float64(pod.Gpus)
		for _, share := range pod.Shares {
			if units > 0 {
				demand += min(1, float64(share)/float64(units))
			} else {
				demand++
			}
		}
		if pod.Gpus > 0 {
			out.Shapes = append(out.Shapes, pod.Shape)
			out.Classes = append(out.Classes, ClassKey{"whole", pod.Gpus, pod.Grid.CPUMilli, pod.Grid.RAMMiB})
		}
		out.DemandTotal += demand
		for _, product := range pod.Products {
			if out.Demand == nil {
				out.Demand = map[string]float64{}
			}
			out.Demand[product] += demand / float64(len(pod.Products))
		}
	}
	return out
}

type seen struct {
	info       fwk.NodeInfo
	generation int64
	pods       int // beside the generation: see read
	placed     *Placed
	epoch      uint64
}

// Cluster keeps the cluster's figures from kube-scheduler's snapshot: each node's
// Placed is read again only when its NodeInfo's generation moved, and the totals are
// kept by adding and taking away what changed.
type Cluster struct {
	mu       sync.Mutex
	readNode func(*v1.Node) *facts.Node
	now      func() time.Time
	scanned  time.Time // the last full scan
	touched  []string  // nodes to read again at the next Figures
	byName   map[string]*seen
	byInfo   map[fwk.NodeInfo]*seen // the same entries by the snapshot's NodeInfo
	list     []*seen                // by position in the last list given
	epoch    uint64
	counts   *Counts
	capacity map[string]int64
	demand   map[string]float64
	total    float64
	pressure map[string]float64
	classes  map[ClassKey]int64
	shareMix []ShareClass
	dirty    bool
	// pods: each pod's read, by UID and resourceVersion (kube-scheduler never changes
	// a pod object; an update is a new version). A node placed on is read again at the
	// next cycle, and its pods with it; past maxPods the memo starts over. Keyed by
	// strings, not by the object, so that a deleted pod's object is not kept.
	pods map[podVersion]*PodRead
}

type podVersion struct{ uid, version string }

// maxPods bounds the pods read kept (a couple of hundred bytes each).
const maxPods = 1 << 16

// NewCluster keeps figures over nodes read by read (facts.Nodes.Of).
func NewCluster(read func(*v1.Node) *facts.Node) *Cluster {
	return &Cluster{readNode: read, now: time.Now, byName: map[string]*seen{}, byInfo: map[fwk.NodeInfo]*seen{}, counts: NewCounts(),
		capacity: map[string]int64{}, demand: map[string]float64{}, classes: map[ClassKey]int64{}}
}

// Figures is what the scores read of the cluster at one moment.
type Figures struct {
	Mix      Mix
	Pressure map[string]float64
	// ShareMix: the classes of what placed pods ask of GPUs, heaviest first (empty
	// where no pod asks a share).
	ShareMix []ShareClass
}

// ScanEvery: how often Figures reads every node of the snapshot. In between it reads
// again only the nodes this scheduler placed pods on (Touch: Reserve and Unreserve)
// and the nodes it is asked about (Refresh): what changed elsewhere (pods gone, other
// schedulers' pods) reaches the workload mix and the product pressure within this.
const ScanEvery = time.Second

// Nodes lists every node of the cycle's snapshot, and finds one by name.
type Nodes struct {
	List func() ([]fwk.NodeInfo, error)
	Get  func(name string) (fwk.NodeInfo, error)
}

// Size is how many nodes the last scan saw.
func (c *Cluster) Size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byName)
}

// Touch marks a node this scheduler just placed a pod on, or took one back from: the
// next Figures reads it again.
func (c *Cluster) Touch(node string) {
	c.mu.Lock()
	c.touched = append(c.touched, node)
	if s := c.byName[node]; s != nil {
		s.generation = -1 // read again even where its NodeInfo did not move (DRA devices)
	}
	c.mu.Unlock()
}

// Figures are the cluster's figures, read from the snapshot as ScanEvery says.
func (c *Cluster) Figures(nodes Nodes) (Figures, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.now(); c.scanned.IsZero() || now.Sub(c.scanned) >= ScanEvery {
		all, err := nodes.List()
		if err != nil {
			return Figures{}, err
		}
		c.scan(all)
		c.scanned, c.touched = now, c.touched[:0]
	} else {
		for _, name := range c.touched {
			if info, err := nodes.Get(name); err == nil && info != nil {
				c.refresh(info)
			}
		}
		c.touched = c.touched[:0]
	}
	if c.dirty {
		c.pressure, c.dirty = Pressure(c.demand, c.total, c.capacity), false
		c.shareMix = ShareMixOf(c.classes)
	}
	return Figures{Mix: c.counts.Mix(), Pressure: c.pressure, ShareMix: c.shareMix}, nil
}

// Update reads every given node (every node of the snapshot) and answers the figures.
func (c *Cluster) Update(nodes []fwk.NodeInfo) Figures {
	c.mu.Lock()
	c.scanned = time.Time{}
	c.mu.Unlock()
	figures, _ := c.Figures(Nodes{List: func() ([]fwk.NodeInfo, error) { return nodes, nil }})
	return figures
}

// scan reads every node whose NodeInfo changed, and drops the nodes gone (lock held).
func (c *Cluster) scan(nodes []fwk.NodeInfo) {
	if len(c.list) != len(nodes) {
		c.list = make([]*seen, len(nodes))
	}
	for i, info := range nodes {
		s := c.list[i]
		if s == nil || s.info != info {
			if s = c.entry(info); s == nil {
				continue
			}
			c.list[i] = s
		}
		c.read(s, info)
	}
	if len(c.byName) > len(nodes) { // some are gone: mark those still listed
		c.epoch++
		for _, s := range c.list {
			if s != nil {
				s.epoch = c.epoch
			}
		}
		for name, s := range c.byName {
			if s.epoch != c.epoch {
				c.swap(s.placed, nil)
				delete(c.byName, name)
				delete(c.byInfo, s.info)
			}
		}
	}
}

// entry is the node's entry, made on first sight and tied to this NodeInfo (lock held).
func (c *Cluster) entry(info fwk.NodeInfo) *seen {
	if s := c.byInfo[info]; s != nil {
		return s
	}
	node := info.Node()
	if node == nil {
		return nil
	}
	s := c.byName[node.Name]
	if s == nil {
		s = &seen{generation: -1}
		c.byName[node.Name] = s
	}
	if s.info != nil {
		delete(c.byInfo, s.info)
	}
	s.info = info
	c.byInfo[info] = s
	return s
}

// read reads the node again where its NodeInfo changed (lock held).
func (c *Cluster) read(s *seen, info fwk.NodeInfo) {
	// kube-scheduler 1.36+ assumes a pod group's members into the cycle's snapshot and
	// puts the NodeInfo's generation back (Snapshot.AssumePod, ForgetPod): the number
	// of pods moves where the generation does not.
	if generation, pods := info.GetGeneration(), len(info.GetPods()); generation != s.generation || pods != s.pods {
		s.generation, s.pods = generation, pods
		old := s.placed
		s.placed = place(c.readNode(info.Node()), info.GetPods(), c.readPod)
		c.swap(old, s.placed)
	}
}

// readPod is a pod's read, from the memo (lock held).
func (c *Cluster) readPod(pod *v1.Pod) *PodRead {
	key := podVersion{string(pod.UID), pod.ResourceVersion}
	if key.uid == "" || key.version == "" { // not from the API server (tests): no key
		return ReadPod(pod)
	}
	if read, ok := c.pods[key]; ok {
		return read
	}
	if len(c.pods) >= maxPods || c.pods == nil {
		c.pods = make(map[podVersion]*PodRead, 1024)
	}
	read := ReadPod(pod)
	c.pods[key] = read
	return read
}

// refresh reads one node again where it changed (lock held).
func (c *Cluster) refresh(info fwk.NodeInfo) *seen {
	s := c.entry(info)
	if s != nil {
		c.read(s, info)
	}
	return s
}

// Used is the CPU (millicores) and memory (MiB) the GPU pods of a NodeInfo request,
// each pod read once (the figures' memo). It reads the NodeInfo as given, and only
// reads it: a preemption's what-if, or a Filter on nominated pods, leaves the figures
// as they were.
func (c *Cluster) Used(info fwk.NodeInfo) [2]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out [2]int64
	for _, pod := range info.GetPods() {
		if read := c.readPod(pod.GetPod()); read != nil {
			out[0] += read.CPUMilli
			out[1] += read.RAMMiB
		}
	}
	return out
}

// swap takes a node's old figures away and adds its new ones. The shapes change by
// their net difference only, so the mix's count of pods placed and gone moves by one
// per pod, as the extender's does (a node re-read with one pod more moves it by one).
func (c *Cluster) swap(old, new *Placed) {
	delta := map[Shape]int64{}
	if old != nil {
		for _, shape := range old.Shapes {
			delta[shape]--
		}
	}
	if new != nil {
		for _, shape := range new.Shapes {
			delta[shape]++
		}
	}
	for shape, d := range delta {
		if d != 0 {
			c.counts.Add(shape, d)
		}
	}
	c.account(old, -1)
	c.account(new, 1)
}

// account adds (sign 1) or takes away (-1) a node's figures other than its shapes.
func (c *Cluster) account(p *Placed, sign int64) {
	if p == nil {
		return
	}
	c.dirty = true
	if p.Model != "" && p.Allocated > 0 {
		if left := c.capacity[p.Model] + sign*p.Allocated; left > 0 {
			c.capacity[p.Model] = left
		} else {
			delete(c.capacity, p.Model)
		}
	}
	for _, class := range p.Classes {
		if left := c.classes[class] + sign; left > 0 {
			c.classes[class] = left
		} else {
			delete(c.classes, class)
		}
	}
	c.total += float64(sign) * p.DemandTotal
	for product, demand := range p.Demand {
		if share := c.demand[product] + float64(sign)*demand; share > 1e-9 {
			c.demand[product] = share
		} else {
			delete(c.demand, product)
		}
	}
}
