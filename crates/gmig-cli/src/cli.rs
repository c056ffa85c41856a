//! Command-line surface of `gmig`. Every subcommand's arguments are declared here.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  runtime error (bad input, I/O failure, rejected or broken migration)
  2  usage error
  3  check failed (replay differs from the fixture, migrated run not identical)
  4  migration in doubt: the switch-over broke where this side cannot tell whether the
     other side runs the vGPU; this side kept a stopped copy in its checkpoint file
     (resume it with `gmig migrate --resume FILE` only once the other side is known
     not to run the vGPU; docs/reliability.md)

Logging: set RUST_LOG (e.g. RUST_LOG=gmig_core=debug); logs go to stderr.";

/// Live migration of mediated Intel vGPUs (GVT-g style) between KVM hosts.
#[derive(Debug, Parser)]
#[command(name = "gmig", version, about, after_help = EXIT_CODES, propagate_version = true)]
pub struct Cli {
    /// Print machine-readable JSON on stdout instead of human-readable text.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Decode a command buffer (AUB capture or raw dwords) into an aubinator-like listing.
    Decode(DecodeArgs),
    /// Decode, audit and remap a fixture with the slice move it names; fail if the result differs.
    Replay(ReplayArgs),
    /// Migrate a simulated vGPU: run as destination (--listen) or source (--to).
    Migrate(MigrateArgs),
    /// Benchmarks: page hashing against memory bandwidth, the migration matrix, the gMig paper.
    Bench(BenchArgs),
    /// Serve a simulated vGPU to a VMM over vfio-user.
    Serve(ServeArgs),
    /// Migrate a vGPU under the desktop workload over loopback TCP and print the downtime report.
    Demo(DemoArgs),
    /// A real KVM guest driving the vGPU: run it, or live-migrate the whole VM.
    #[command(subcommand)]
    Vm(VmCommand),
}

/// `gmig vm` subcommands.
#[derive(Debug, Subcommand)]
pub enum VmCommand {
    /// Boot the guest GPU driver under KVM on a vGPU and run it to the end.
    Run(VmRunArgs),
    /// Live-migrate the whole VM: as destination (--listen) or source (--to).
    Migrate(VmMigrateArgs),
}

/// The guest and the vGPU it runs on.
#[derive(Debug, Args)]
pub struct VmGuestArgs {
    /// What the guest program renders (desktop, compute).
    #[arg(long, default_value = "desktop")]
    pub profile: String,
    /// Frames before the guest prints its checksum and halts.
    #[arg(long, default_value_t = 48)]
    pub frames: u32,
    /// Framebuffer width and height.
    #[arg(long, default_value_t = 256)]
    pub width: u32,
    /// See `--width`.
    #[arg(long, default_value_t = 192)]
    pub height: u32,
    /// Guest RAM in MiB.
    #[arg(long, default_value_t = 64)]
    pub ram_mib: u64,
    /// Seed of the guest's random choices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Attach the vGPU over vfio-user from this socket (`gmig serve --ram-by-vmm`) instead of
    /// linking it in process.
    #[arg(long)]
    pub vgpu_socket: Option<PathBuf>,
    /// Host slot of an in-process vGPU (a destination uses another slot than its source).
    #[arg(long, default_value_t = 0)]
    pub slot: u32,
    /// How the VMM reads KVM's dirty log: `auto` uses KVM_CLEAR_DIRTY_LOG with manual protect
    /// (and initially-set) where KVM offers it, `manual` the same without initially-set, `get`
    /// plain KVM_GET_DIRTY_LOG.
    #[arg(long, value_enum, default_value = "auto")]
    pub dirty_log: DirtyLogArg,
    /// Ask for transparent huge pages on guest RAM (madvise; the kernel must allow them for
    /// shared memory: `/sys/kernel/mm/transparent_hugepage/shmem_enabled` not `never`).
    #[arg(long, value_enum, default_value = "on")]
    pub thp: OnOff,
}

/// How the VMM reads KVM's dirty log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DirtyLogArg {
    /// Manual protect with initially-set where offered, else GET.
    Auto,
    /// Manual protect without initially-set where offered, else GET.
    Manual,
    /// Plain KVM_GET_DIRTY_LOG.
    Get,
}

/// How `gmig vm migrate` writes its journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JournalArg {
    /// A writer thread.
    Thread,
    /// As the bytes cross.
    Inline,
    /// None.
    Off,
}

/// A switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

#[derive(Debug, Args)]
pub struct VmRunArgs {
    #[command(flatten)]
    pub guest: VmGuestArgs,
}

#[derive(Debug, Args)]
pub struct VmMigrateArgs {
    #[command(flatten)]
    pub guest: VmGuestArgs,
    /// Destination: accept the VM on this address (e.g. 0.0.0.0:4444), then run it to the end.
    #[arg(long, conflicts_with = "to")]
    pub listen: Option<String>,
    /// Source: migrate the VM to this address.
    #[arg(long)]
    pub to: Option<String>,
    /// Source: start migrating once the guest has completed this many frames.
    #[arg(long, default_value_t = 16)]
    pub at_frame: u64,
    /// Source: join only KVM's dirty log, not the vGPU's DMA log (negative control: the
    /// destination then misses the pages the vGPU wrote).
    #[arg(long)]
    pub no_gpu_dirty: bool,
    /// Source: emulated link speed in Gbit/s.
    #[arg(long)]
    pub link_gbps: Option<f64>,
    /// Source: guest exits between pre-copy rounds.
    #[arg(long, default_value_t = 64)]
    pub round_exits: u64,
    /// Source: switch over when the guest completes this frame (pre-copy rounds run until
    /// then) instead of when pre-copy converges; the migration fails if the guest finishes
    /// first.
    #[arg(long)]
    pub switch_at_frame: Option<u64>,
    /// How the journal is written, for measuring what it costs: `thread` (the default) hands
    /// the bytes to a writer thread, `inline` writes them as they cross, `off` keeps none (a
    /// side left in doubt then has no copy).
    #[arg(long = "x-journal", value_enum, default_value = "thread", hide = true)]
    pub x_journal: JournalArg,
    #[command(flatten)]
    pub hand_over: HandOverArgs,
}

/// What a side does when the switch-over breaks (docs/reliability.md), for `gmig migrate` and
/// `gmig vm migrate`.
#[derive(Debug, Args)]
pub struct HandOverArgs {
    /// Resume the copy a side left in doubt from its checkpoint file (the vGPU's stream, or the VM
    /// stream's journal) and run it — only once the other side is known not to run it.
    #[arg(long, conflicts_with_all = ["listen", "to"])]
    pub resume: Option<PathBuf>,
    /// Where this side keeps its copy if the switch-over leaves it in doubt (default:
    /// gmig-in-doubt-ROLE-PID.gmig, or gmig-vm-in-doubt-ROLE-PID.gmigvm, in the working
    /// directory). `gmig vm migrate` journals the stream there while it migrates and removes the
    /// file unless in doubt.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Seconds either side waits for the other before it gives up.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
}

impl HandOverArgs {
    /// `--timeout` as a duration; refused unless a positive, finite number of seconds.
    pub fn timeout(&self) -> anyhow::Result<std::time::Duration> {
        if self.timeout.is_finite() && self.timeout > 0.0 {
            Ok(std::time::Duration::from_secs_f64(self.timeout))
        } else {
            Err(anyhow::anyhow!(
                "--timeout must be a positive number of seconds"
            ))
        }
    }
}

/// GEN generation of the command stream.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GenArg {
    /// Broadwell.
    #[value(name = "8")]
    Gen8,
    /// Skylake, Kaby Lake, Coffee Lake.
    #[value(name = "9")]
    Gen9,
    /// Ice Lake.
    #[value(name = "11")]
    Gen11,
}

/// GPU engine (ring) that executes the command stream.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum EngineArg {
    /// Render (RCS).
    Render,
    /// Blitter (BCS).
    Blitter,
    /// Video (VCS).
    Video,
    /// Video enhancement (VECS).
    VideoEnhance,
}

#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// AUB capture (GEN8+, as Mesa's intel_dump_gpu writes it), or raw little-endian dwords with
    /// --raw.
    pub file: PathBuf,
    /// Treat FILE as raw little-endian dwords (a privileged ring-level buffer) rather than an AUB
    /// capture.
    #[arg(long)]
    pub raw: bool,
    /// Engine the raw dwords run on (with --raw; default render). For an AUB capture, only list
    /// the submissions to this engine.
    #[arg(long, value_enum)]
    pub engine: Option<EngineArg>,
    /// GEN generation (with --raw, default 9; for an AUB capture it overrides the generation the
    /// capture names).
    #[arg(long = "gen", value_enum)]
    pub generation: Option<GenArg>,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Fixture to replay: a directory under fixtures/ (or its manifest.toml), or a directory of
    /// fixtures to replay them all.
    pub fixture: PathBuf,
}

/// Migration policy.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PolicyArg {
    /// Stop the vGPU, then send everything.
    StopAndCopy,
    /// QEMU-like iterative pre-copy rounds.
    Iterative,
    /// gMig: send every page once while running, then only hash-changed pages.
    OneShot,
    /// One-shot, re-hashing only the sound candidate set in downtime.
    OneShotNarrow,
}

/// Guest workload profile.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ProfileArg {
    /// Nothing submitted.
    Idle,
    /// Compositor blits of windows.
    Desktop,
    /// Full render-target and depth rewrite per frame, texture uploads.
    #[value(name = "3d")]
    ThreeD,
    /// NV12 frames written by the video engine.
    Video,
    /// Large buffer writes.
    Compute,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Destination: listen on this address for an incoming migration (HOST:PORT, or
    /// unix:PATH for a Unix socket).
    #[arg(long, conflicts_with = "to")]
    pub listen: Option<String>,
    /// Source: migrate to the destination listening at this address (HOST:PORT or unix:PATH).
    #[arg(long, required_unless_present_any = ["listen", "resume"])]
    pub to: Option<String>,
    #[command(flatten)]
    pub hand_over: HandOverArgs,
    /// Guest workload running during the migration.
    #[arg(long, value_enum, default_value = "desktop")]
    pub profile: ProfileArg,
    /// vGPU type: aperture+hidden MiB (64+384, 128+512, 256+1024, 512+2048).
    #[arg(long, default_value = "64+384")]
    pub vgpu_type: String,
    /// Migration policy.
    #[arg(long, value_enum, default_value = "one-shot-narrow")]
    pub policy: PolicyArg,
    /// Emulated link speed in Gbit/s (unlimited when absent).
    #[arg(long)]
    pub link_gbps: Option<f64>,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Guest RAM in MiB (source and destination must agree).
    #[arg(long, default_value_t = 128)]
    pub ram_mib: u64,
    /// Source: frames the guest runs before the migration starts.
    #[arg(long, default_value_t = 5)]
    pub frames_before: u64,
    /// Dispatched GPU workloads the stop lets finish on the source; the rest is preempted at a
    /// command boundary and resumes on the destination (default 0: everything is carried).
    #[arg(long, default_value_t = 0)]
    pub max_drain: usize,
    /// Bounds the drain in time as well: when it runs out, the running workload is preempted
    /// at the next command boundary and carried.
    #[arg(long, value_name = "MS")]
    pub max_drain_ms: Option<f64>,
    /// Source: commands of each frame the GPU runs as the guest submits it, so that the stop
    /// finds a workload part-way, preempts it and carries it (0: the frame waits for the next
    /// step).
    #[arg(long, default_value_t = 0)]
    pub gpu_ahead: u64,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

#[derive(Debug, Subcommand)]
pub enum BenchWhat {
    /// Page-hashing throughput against plain memory-read bandwidth of the same buffer.
    Hash {
        /// Buffer size in MiB (should exceed the last-level cache).
        #[arg(long, default_value_t = 448)]
        size_mib: usize,
        /// Hashing threads (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Timed repetitions of each pass; the best of each is reported.
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Hashing kernel (default: the widest this CPU runs).
        #[arg(long, value_enum, default_value_t = HashKernelArg::Auto)]
        kernel: HashKernelArg,
        /// Prefetch distance in pages while hashing (0: no software prefetch; default: chosen for
        /// this CPU, 0 on AMD and 1 elsewhere).
        #[arg(long)]
        prefetch_pages: Option<usize>,
    },
    /// The migration matrix: profiles × vGPU types × policies × link speeds × repetitions.
    Migrate(BenchMigrateArgs),
    /// Reproduce the shape of gMig's evaluation beside the paper's figures.
    Paper(BenchPaperArgs),
    /// Whole-VM live migration of a real KVM guest driving the vGPU (needs /dev/kvm): guest RAM
    /// migrated by the VMM through KVM's dirty log and the vGPU's DMA log, separate from the
    /// vGPU's own stream. Profiles × guest RAM sizes × link speeds × repetitions.
    Vm(BenchVmArgs),
    /// Host evacuation: N whole KVM guests (needs /dev/kvm), each with its vGPU in its own slot,
    /// migrated at once to N destinations over one shared link; each VM's downtime and largest
    /// gap, the evacuation's total time and the link's use, and every VM checked against its
    /// unmigrated run.
    Evacuate(BenchEvacuateArgs),
}

/// Knobs shared by `gmig bench migrate` and `gmig bench paper`.
#[derive(Debug, Clone, Args)]
pub struct BenchCommonArgs {
    /// Guest workloads (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub profiles: Vec<ProfileArg>,
    /// vGPU types as aperture+hidden MiB (comma-separated: 64+384,128+512,256+1024,512+2048).
    #[arg(long, value_delimiter = ',')]
    pub types: Vec<String>,
    /// Link speeds: `unlimited` or Gbit/s (comma-separated, e.g. unlimited,25,10,1).
    #[arg(long, value_delimiter = ',')]
    pub links: Vec<String>,
    /// Repetitions per row.
    #[arg(long)]
    pub reps: Option<usize>,
    /// Hashing threads (default: one per core, less two on machines of four cores or more: the
    /// source's sender and the destination's applier share this machine with the hash).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Guest RAM in MiB instead of the vGPU type's graphics-memory size (smoke tests).
    #[arg(long)]
    pub ram_mib: Option<u64>,
    /// The small (256×192) workload instead of 1024×768 (smoke tests).
    #[arg(long, conflicts_with = "resolution")]
    pub small_workload: bool,
    /// Screen (and render-target, video frame) size of the guest's workload: 1080p, 1440p, 4k or
    /// WIDTHxHEIGHT (default 1024x768).
    #[arg(long)]
    pub resolution: Option<String>,
    /// Turn the engine's switch-over acknowledgement off: the source stops the vGPU as soon as it
    /// has written the last pre-copy byte, and the downtime absorbs whatever pre-copy data the
    /// destination is still applying (to measure what the acknowledgement saves).
    #[arg(long)]
    pub no_switchover_ack: bool,
    /// Turn one-shot-narrow's overlapped verification off: the downtime then re-hashes every
    /// candidate page gathered since pre-copy began, not only those written after the pass
    /// (to measure what the verification saves).
    #[arg(long)]
    pub no_verify_before_stop: bool,
    /// Most overlapped verifications before the stop (one-shot-narrow): it verifies again while
    /// the last one found more than a round's worth of pages changed (default: the engine's, 8;
    /// 1: a single verification).
    #[arg(long)]
    pub verify_rounds: Option<u32>,
    /// Dispatched workloads the stop lets finish on the source (the rest is preempted at a
    /// command boundary, travels in the stream and resumes on the destination); default: the
    /// engine's (`MigrationConfig::max_drain`: 0, carry everything). What the drained workloads
    /// write is stop-copy data.
    #[arg(long)]
    pub max_drain: Option<usize>,
    /// Bounds `--max-drain` in time as well (milliseconds).
    #[arg(long, value_name = "MS")]
    pub max_drain_ms: Option<f64>,
    /// Commands of each frame the GPU runs as soon as the guest submits it, so that the stop
    /// finds a workload part-way and preempts it (0: the frame waits for the next step).
    #[arg(long, default_value_t = 0)]
    pub gpu_ahead: u64,
    /// Leave untouched guest pages unbacked (they then read from the kernel's shared zero page,
    /// in cache, which flatters hashing); by default every page is backed before migrating.
    #[arg(long)]
    pub untouched_memory: bool,
    /// Run the source on these CPUs (e.g. `0-7`; with `--dest-cpus`, disjoint from it): its
    /// migration thread, hashing pool and stop-copy pipeline, as on a host of its own. The
    /// default hashing threads become one per source CPU less the sender's.
    #[arg(long, requires = "dest_cpus")]
    pub source_cpus: Option<String>,
    /// Run the destination on these CPUs (e.g. `8-15`); see `--source-cpus`.
    #[arg(long, requires = "source_cpus")]
    pub dest_cpus: Option<String>,
    /// The guest runs a frame after every 8 pre-copy batches of the engine (exactly
    /// reproducible; it draws only while the engine sends) instead of on its own clock.
    #[arg(long, conflicts_with = "guest_fps")]
    pub batch_stepped: bool,
    /// The clocked guest's frame rate: frames per second, or `max` (as fast as the vGPU runs
    /// them). Default: 60 for idle and desktop, `max` for 3d, video and compute.
    #[arg(long, value_name = "FPS|max")]
    pub guest_fps: Option<String>,
    /// Skip checking each migrated guest against an unmigrated run of as many frames (the
    /// check runs after the timed part, but it boots a second guest and replays its frames).
    #[arg(long)]
    pub no_check: bool,
    /// Write JSON, Markdown and SVG plots into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BenchMigrateArgs {
    /// A small matrix that finishes in under two minutes on a 2-core machine.
    #[arg(long)]
    pub quick: bool,
    /// Migration policies (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub policies: Vec<PolicyArg>,
    #[command(flatten)]
    pub common: BenchCommonArgs,
}

/// The KVM guest of `gmig bench vm` and of each VM of `gmig bench evacuate`.
#[derive(Debug, Clone, Args)]
pub struct BenchGuestArgs {
    /// Frames each guest renders before it halts.
    #[arg(long, default_value_t = 48)]
    pub frames: u32,
    /// The migrations start once every guest has completed this many frames (below `--frames`).
    #[arg(long, default_value_t = 16)]
    pub at_frame: u64,
    /// Pages of ordinary guest RAM each guest's CPU rewrites every frame (its CPU dirty rate).
    #[arg(long, default_value_t = 64)]
    pub scratch_pages: u32,
    /// Framebuffer width.
    #[arg(long, default_value_t = 256)]
    pub width: u32,
    /// Framebuffer height.
    #[arg(long, default_value_t = 192)]
    pub height: u32,
    /// Seed of the guest's random choices (`bench evacuate`: VM i uses seed + i).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct BenchVmArgs {
    /// Guest programs (comma-separated: desktop, compute; default both).
    #[arg(long, value_delimiter = ',')]
    pub profiles: Vec<String>,
    /// Guest RAM sizes in MiB (comma-separated; default 64,512).
    #[arg(long, value_delimiter = ',')]
    pub ram_mib: Vec<u64>,
    /// Link speeds: `unlimited` or Gbit/s (comma-separated; default unlimited,10).
    #[arg(long, value_delimiter = ',')]
    pub links: Vec<String>,
    /// Repetitions per row.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    #[command(flatten)]
    pub guest: BenchGuestArgs,
    /// Guest exits between two pre-copy rounds.
    #[arg(long, default_value_t = 64)]
    pub round_exits: u64,
    /// Dirty-log modes to compare (comma-separated: auto, manual, get; default auto).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub dirty_log: Vec<DirtyLogArg>,
    /// Transparent huge pages on guest RAM, or not (comma-separated: on, off; default on).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub thp: Vec<OnOff>,
    /// In the stop, stop the vGPU before reading the logs and sending any page, instead of
    /// sending KVM's pages while it stops (measuring what
    /// `gmig_vmm::migrate::Options::overlap_stop` saves).
    #[arg(long = "x-no-overlap-stop", hide = true)]
    pub x_no_overlap_stop: bool,
}

#[derive(Debug, Args)]
pub struct BenchEvacuateArgs {
    /// VMs moved at once, one evacuation per count (comma-separated, 1 to 7; default 1,2,4,7).
    #[arg(long, value_delimiter = ',')]
    pub vms: Vec<usize>,
    /// The shared link: `unlimited` or Gbit/s (comma-separated; default 10,unlimited).
    #[arg(long, value_delimiter = ',')]
    pub links: Vec<String>,
    /// Evacuations per VM count and link.
    #[arg(long, default_value_t = 1)]
    pub reps: usize,
    /// Guest RAM of each VM, MiB.
    #[arg(long, default_value_t = 512)]
    pub ram_mib: u64,
    #[command(flatten)]
    pub guest: BenchGuestArgs,
    /// Guest exits between two pre-copy rounds (with at most 8 rounds, about 8 frames of the
    /// guest's run at 16: the guest keeps some of its run for its destination).
    #[arg(long, default_value_t = 16)]
    pub round_exits: u64,
    /// Run the sources on these CPUs (e.g. `0-7`), as on a host of their own; with
    /// `--dest-cpus`, disjoint from it.
    #[arg(long, requires = "dest_cpus")]
    pub source_cpus: Option<String>,
    /// Run the destinations on these CPUs (e.g. `8-15`).
    #[arg(long, requires = "source_cpus")]
    pub dest_cpus: Option<String>,
    /// Write JSON and Markdown (evacuate.json, evacuate.md) into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Negative control: RAM pre-copy reads KVM's dirty log only, not the vGPU's DMA log (the
    /// pages the vGPUs wrote are missed and the guests differ from their unmigrated runs).
    #[arg(long = "x-no-gpu-dirty", hide = true)]
    pub x_no_gpu_dirty: bool,
}

#[derive(Debug, Args)]
pub struct BenchPaperArgs {
    #[command(flatten)]
    pub common: BenchCommonArgs,
}

/// Page-hashing kernel for `gmig bench hash`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HashKernelArg {
    /// The widest kernel this CPU runs.
    Auto,
    /// xxhash-rust as compiled (SSE2 on default x86-64 builds).
    Portable,
    /// AVX2.
    Avx2,
    /// AVX-512F.
    Avx512,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Unix socket path to serve vfio-user on.
    #[arg(long)]
    pub socket: PathBuf,
    /// vGPU type: aperture+hidden MiB (64+384, 128+512, 256+1024, 512+2048).
    #[arg(long = "type", alias = "vgpu-type", default_value = "64+384")]
    pub vgpu_type: String,
    /// Run the built-in guest-driver model with this workload on the client's RAM once it is
    /// mapped (one frame every few messages), for demonstrations without a real guest driver.
    #[arg(long, value_enum)]
    pub profile: Option<ProfileArg>,
    /// Serve this many clients, one after another, then exit (default: serve for ever).
    #[arg(long)]
    pub clients: Option<u64>,
    /// The VMM migrates guest RAM itself (QEMU, `gmig vm`): the migration stream carries the
    /// vGPU's state only, and the pages the vGPU writes reach the VMM through DMA logging.
    #[arg(long)]
    pub ram_by_vmm: bool,
    /// Place the vGPU in this host slot (0: first fit; n: after n other vGPUs), so that a
    /// destination can sit elsewhere in graphics memory than its source.
    #[arg(long, default_value_t = 0)]
    pub slot: u32,
    /// The host's slot registry, a directory every `gmig serve` of this host shares (libvirt's
    /// hook uses /run/gmig/slots): the server records the slices it takes there while it runs,
    /// and `--slot` becomes a preference: when a running server's vGPU overlaps that slot, the
    /// next free slot up is taken (then the lowest), and none when the host is full (an error
    /// naming the servers that hold the slots).
    #[arg(long, value_name = "DIR")]
    pub slots: Option<PathBuf>,
    /// Poll the socket for up to this many microseconds after each message before sleeping
    /// until the next (default 0: sleep at once): a register access that comes within it is
    /// answered without waking a sleeping thread, at the price of a core kept busy that long
    /// after every message.
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub poll_us: u64,
    /// Dispatched GPU workloads the migration's stop lets finish on the source; the rest is
    /// preempted at a command boundary, travels in the vGPU's state and resumes on the
    /// destination (default 0: everything is carried).
    #[arg(long)]
    pub max_drain: Option<usize>,
    /// Bounds `--max-drain` in time as well (milliseconds).
    #[arg(long, value_name = "MS")]
    pub max_drain_ms: Option<f64>,
    /// Write the guest's screen (pipe A's primary plane) to this PNG file whenever it changes
    /// (looked at every 100 ms at most while the guest scans out).
    #[arg(long, value_name = "PNG")]
    pub screen: Option<PathBuf>,
    /// Negative control: a restored vGPU keeps the source's graphics addresses.
    #[arg(long, hide = true)]
    pub x_no_remap: bool,
    /// Negative control: the vGPU has no virtual monitor (no port is present to the guest).
    #[arg(long, hide = true)]
    pub x_no_monitor: bool,
    /// Negative control: DMA logging on, off (refused) or blind (reports no page).
    #[arg(long, hide = true, default_value = "on")]
    pub x_dma_log: String,
    /// Negative control: the device offers no migration (DEVICE_FEATURE refused).
    #[arg(long, hide = true)]
    pub x_no_migration: bool,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Migration policy the demo uses.
    #[arg(long, value_enum, default_value = "one-shot-narrow")]
    pub policy: PolicyArg,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also run the other three policies and report them side by side.
    #[arg(long)]
    pub compare: bool,
    /// Emulated link speed in Gbit/s (unlimited when absent).
    #[arg(long)]
    pub link_gbps: Option<f64>,
    /// Skip the real KVM guest (run only the simulated one).
    #[arg(long)]
    pub no_vm: bool,
    /// The simulated guest runs a frame after every 8 pre-copy batches of the engine (exactly
    /// reproducible) instead of on its own clock at 60 fps.
    #[arg(long)]
    pub batch_stepped: bool,
}

/// The stop's drain from `--max-drain` and `--max-drain-ms` (`None` for either: `default`'s).
pub fn drain(
    workloads: Option<usize>,
    ms: Option<f64>,
    default: gmig_core::migration::Drain,
) -> anyhow::Result<gmig_core::migration::Drain> {
    let time = match ms {
        Some(ms) => Some(
            std::time::Duration::try_from_secs_f64(ms / 1000.0)
                .map_err(|e| anyhow::anyhow!("--max-drain-ms {ms}: {e}"))?,
        ),
        None => default.time,
    };
    Ok(gmig_core::migration::Drain {
        workloads: workloads.unwrap_or(default.workloads),
        time,
    })
}
