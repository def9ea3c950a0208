"""This host's telemetry for `clusterctl top`, `run` and the dashboard (observe/telemetry.py): `python -c PROGRAM
[--every S] WORKDIR PS...`, where PS is the portable ps command line that lists processes (observe/procs.py's
PS_COMMAND, as words). Prints one JSON line, or with --every one every S seconds until its output is closed (one
Python per host for as long as it is watched, not one per sample; the command's watchdog ends it when the
connection closes): memory used / total and pressure, swap, load and cores, GPU utilisation, thermal state, power
(where the OS gives it without root), disk free in WORKDIR, and the lines of PS's listing that belong to clusterctl
runs (the controller reads them with procs.py's own parser). Standard library only, any Python 3; nothing needs root.

macOS (told by `uname -s`, so that a fake Mac on a Linux kernel is read as a Mac): `sysctl` (hw.memsize, hw.ncpu,
vm.loadavg, vm.swapusage, kern.memorystatus_vm_pressure_level), `vm_stat`, `memory_pressure`, `ioreg -r -d 1 -w 0
-c IOAccelerator` (its PerformanceStatistics' "Device Utilization %"), `pmset -g therm`. No power figure: macOS
gives one only to root (powermetrics).
Linux: /proc/meminfo, /proc/pressure/memory (PSI, where the kernel has it), /proc/loadavg, /proc/vmstat,
os.cpu_count(), /sys/class/thermal, and `nvidia-smi` where it exists (GPU utilisation, memory, temperature, power).

The parsers are pure functions (text in, values out), tested on captured outputs (tests/unit/test_telemetry.py,
tests/fixtures/macos/README.md); a tool that fails or is missing leaves its figures out (None) and is named in
"errors", never stops the sample."""
import os
import re
import subprocess
import sys
import time

from .contract import EVERY, RUN_ID, RUN_TOKEN, reply

TOOL_TIMEOUT_S = 10
PRESSURE_LEVELS = {1: "normal", 2: "warn", 4: "critical"}        # kern.memorystatus_vm_pressure_level
# Linux has no pressure level of its own: PSI's share of the last 10 s that tasks stalled on memory (percent), or
# failing PSI, the share of memory still available (docs/observe.md#clusterctl-top)
PSI_WARN, PSI_CRITICAL = 10.0, 10.0          # some avg10 >= 10: warn; full avg10 >= 10: critical
AVAILABLE_WARN, AVAILABLE_CRITICAL = 10.0, 5.0
_PS_ROW = re.compile(r"^\s*\d+\s+\d+\s")
_PS_COLUMNS = re.compile(r"^(\s*\d+\s+\d+\s+\S+\s+\S+\s+\d+)\s(.*)$")
_TOKEN = re.compile(RUN_TOKEN + RUN_ID)
_MLX_RANK = re.compile(r"\bMLX_RANK=['\"]?\d+")
ARGS_KEPT = 200
_UNITS = {"B": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


# ---- macOS -------------------------------------------------------------------------------------------------------

def parse_sysctl(text):
    """`sysctl NAME ...` (`name: value` lines) as {name: value text}."""
    found = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() and " " not in name.strip():
            found[name.strip()] = value.strip()
    return found


def parse_loadavg_sysctl(text):
    """vm.loadavg's `{ 1.99 1.87 1.79 }`: the 1-minute load average."""
    m = re.search(r"([0-9]+(?:[.,][0-9]+)?)", text or "")
    return float(m.group(1).replace(",", ".")) if m else None


def parse_swapusage(text):
    """vm.swapusage's `total = 1024.00M  used = 25.50M  free = 998.50M  (encrypted)`: (used, total) in bytes."""
    sizes = {}
    for key, number, unit in re.findall(r"(total|used|free)\s*=\s*([0-9]+(?:[.,][0-9]+)?)([BKMGT]?)", text or ""):
        sizes[key] = int(float(number.replace(",", ".")) * _UNITS[unit or "B"])
    return sizes.get("used"), sizes.get("total")


def pressure_level(text):
    """kern.memorystatus_vm_pressure_level: 1 normal, 2 warn, 4 critical."""
    try:
        return PRESSURE_LEVELS.get(int((text or "").strip()))
    except ValueError:
        return None


def parse_vm_stat(text):
    """vm_stat's page counts, by their labels lower-cased (`pages free`, `anonymous pages`, `swapouts`, ...), and
    `page size` from its header (`Mach Virtual Memory Statistics: (page size of 16384 bytes)`)."""
    found = {}
    m = re.search(r"page size of (\d+) bytes", text or "")
    if m:
        found["page size"] = int(m.group(1))
    for label, count in re.findall(r'^"?([A-Za-z][A-Za-z -]*?)"?:\s+(\d+)\.?\s*$', text or "", re.MULTILINE):
        found[label.strip().lower()] = int(count)
    return found


def vm_stat_used(pages):
    """Memory in use, as Activity Monitor counts it: app memory (anonymous pages less purgeable ones) + wired +
    compressed (the pages the compressor occupies), in bytes; active + wired + compressed where vm_stat has no
    anonymous count (before macOS 10.9)."""
    size = pages.get("page size")
    wired, compressed = pages.get("pages wired down"), pages.get("pages occupied by compressor", 0)
    if size is None or wired is None:
        return None
    if "anonymous pages" in pages:
        app = pages["anonymous pages"] - pages.get("pages purgeable", 0)
    elif "pages active" in pages:
        app = pages["pages active"]
    else:
        return None
    return (max(app, 0) + wired + compressed) * size


def parse_memory_pressure(text):
    """memory_pressure's `System-wide memory free percentage: 88%`, and its first line's total (`The system has
    34359738368 (...)`): (free percent, total bytes)."""
    free = re.search(r"System-wide memory free percentage:\s*(\d+)%", text or "")
    total = re.search(r"The system has (\d+)", text or "")
    return (int(free.group(1)) if free else None), (int(total.group(1)) if total else None)


def parse_ioreg_accelerator(text):
    """The busiest accelerator's "Device Utilization %" in `ioreg -r -d 1 -w 0 -c IOAccelerator` (its
    PerformanceStatistics dictionary; the key with its closing quote, never "Device Utilization % at cur p-state")."""
    found = [int(v) for v in re.findall(r'"Device Utilization %"\s*=\s*(\d+)', text or "")]
    return max(found) if found else None


def parse_pmset_therm(text):
    """`pmset -g therm`: {"speed_limit": CPU_Speed_Limit (percent) or None, "warning": the thermal or performance
    warning level recorded (pmset prints `Thermal Warning Level = N`) or None, "state": "throttled" (a speed limit
    under 100, or a warning level above 0), "nominal" (pmset answered: "No thermal warning level has been recorded",
    "No CPU power status has been recorded", a limit of 100) or None (nothing recognisable)}."""
    text = text or ""
    limit = re.search(r"CPU_Speed_Limit\s*=\s*(\d+)", text)
    speed_limit = int(limit.group(1)) if limit else None
    warnings = []
    for kind, level in re.findall(r"(Thermal|Performance) Warning Level\s*(?:=|set to)\s*(\d+)", text, re.IGNORECASE):
        if int(level) > 0:
            warnings.append("%s warning level %d" % (kind.lower(), int(level)))
    answered = speed_limit is not None or warnings or re.search(r"has been recorded|Warning Level", text, re.IGNORECASE)
    if (speed_limit is not None and speed_limit < 100) or warnings:
        state = "throttled"
    else:
        state = "nominal" if answered else None
    return {"speed_limit": speed_limit, "warning": "; ".join(warnings) or None, "state": state}


# ---- Linux -------------------------------------------------------------------------------------------------------

def parse_meminfo(text):
    """/proc/meminfo as {key: bytes} (its `kB` are KiB)."""
    found = {}
    for key, value, unit in re.findall(r"^(\w+(?:\(\w+\))?):\s+(\d+)\s*(kB)?\s*$", text or "", re.MULTILINE):
        found[key] = int(value) * (1024 if unit else 1)
    return found


def parse_psi(text):
    """/proc/pressure/memory: {"some": avg10, "full": avg10} (percent of the last 10 s)."""
    return {kind: float(avg) for kind, avg in re.findall(r"^(some|full)\s+avg10=([0-9.]+)", text or "", re.MULTILINE)}


def linux_pressure(meminfo, psi):
    """normal / warn / critical from PSI where the kernel has it (full avg10 >= 10: critical, some avg10 >= 10:
    warn), else from the share of memory available (< 5%: critical, < 10%: warn); None without MemAvailable."""
    if psi:
        if psi.get("full", 0.0) >= PSI_CRITICAL:
            return "critical"
        return "warn" if psi.get("some", 0.0) >= PSI_WARN else "normal"
    total, available = meminfo.get("MemTotal"), meminfo.get("MemAvailable")
    if not total or available is None:
        return None
    share = 100.0 * available / total
    return "critical" if share < AVAILABLE_CRITICAL else "warn" if share < AVAILABLE_WARN else "normal"


def parse_loadavg(text):
    """/proc/loadavg's first figure (the 1-minute load average)."""
    try:
        return float((text or "").split()[0])
    except (IndexError, ValueError):
        return None


def parse_vmstat_swapouts(text):
    """/proc/vmstat's pswpout: pages swapped out since boot."""
    m = re.search(r"^pswpout\s+(\d+)", text or "", re.MULTILINE)
    return int(m.group(1)) if m else None


def parse_nvidia_smi(text):
    """`nvidia-smi --query-gpu=utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw
    --format=csv,noheader,nounits`: one dict per GPU (memory in MiB; `[N/A]` or `[Not Supported]` as None)."""
    gpus = []
    for line in (text or "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 5:
            continue
        values = []
        for cell in cells:
            try:
                values.append(float(cell))
            except ValueError:
                values.append(None)
        gpus.append(dict(zip(("utilization", "memory_used", "memory_total", "temperature", "power"), values)))
    return gpus


def linux_thermal(zones):
    """[(temperature °C, lowest passive trip point °C or None)] of /sys/class/thermal's zones -> (state, hottest
    °C): throttled when a zone is at or above its passive trip point (where the kernel starts cooling by slowing
    the CPU), nominal otherwise, None without zones."""
    if not zones:
        return None, None
    hottest = max(t for t, _ in zones)
    hot = any(trip is not None and t >= trip for t, trip in zones)
    return ("throttled" if hot else "nominal"), hottest


# ---- reading them on this host -----------------------------------------------------------------------------------

def run(argv, errors, merge_stderr=False, partial=False):
    """A tool's stdout (stderr too with `merge_stderr`), or None (its failure noted in `errors`); with `partial`,
    its stdout even when it failed (sysctl answers the names it knows and fails for one it does not)."""
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                           universal_newlines=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        errors.append("%s: %s" % (argv[0], e))
        return None
    if p.returncode != 0:
        errors.append("%s exited %d: %s" % (argv[0], p.returncode, " ".join((p.stderr or p.stdout or "").split())[:200]))
        return p.stdout if partial else None
    return p.stdout


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def macos(doc, errors):
    sources = doc["sources"]
    values = parse_sysctl(run(["sysctl", "hw.memsize", "hw.ncpu", "vm.loadavg", "vm.swapusage",
                               "kern.memorystatus_vm_pressure_level"], errors, partial=True) or "")
    if "hw.memsize" in values:
        doc["memory_total"] = int(values["hw.memsize"])
    if "hw.ncpu" in values:
        doc["cores"], sources["cores"] = int(values["hw.ncpu"]), "sysctl hw.ncpu"
    doc["load_1m"] = parse_loadavg_sysctl(values.get("vm.loadavg"))
    if doc["load_1m"] is not None:
        sources["load"] = "sysctl vm.loadavg"
    doc["swap_used"], doc["swap_total"] = parse_swapusage(values.get("vm.swapusage"))
    if doc["swap_total"] is not None:
        sources["swap"] = "sysctl vm.swapusage"
    doc["pressure"] = pressure_level(values.get("kern.memorystatus_vm_pressure_level"))
    if doc["pressure"] is not None:
        sources["pressure"] = "sysctl kern.memorystatus_vm_pressure_level"
    pages = parse_vm_stat(run(["vm_stat"], errors) or "")
    doc["memory_used"] = vm_stat_used(pages)
    doc["swapouts"] = pages.get("swapouts")
    if doc["memory_used"] is not None:
        sources["memory"] = "vm_stat" + (", sysctl hw.memsize" if "hw.memsize" in values else "")
    free, total = parse_memory_pressure(run(["memory_pressure"], errors) or "")
    doc["memory_free_percent"] = free
    if doc["memory_total"] is None:
        doc["memory_total"] = total
    if free is not None:
        sources["memory_free_percent"] = "memory_pressure"
    doc["gpu_percent"] = parse_ioreg_accelerator(run(["ioreg", "-r", "-d", "1", "-w", "0", "-c", "IOAccelerator"],
                                                     errors) or "")
    if doc["gpu_percent"] is not None:
        sources["gpu"] = "ioreg IOAccelerator"
    # pmset prints "CPU Power notify" on stderr and its values on stdout
    therm = parse_pmset_therm(run(["pmset", "-g", "therm"], errors, merge_stderr=True) or "")
    doc["thermal"], doc["speed_limit"], doc["thermal_warning"] = therm["state"], therm["speed_limit"], therm["warning"]
    if therm["state"] is not None:
        sources["thermal"] = "pmset -g therm"


def linux(doc, errors):
    sources = doc["sources"]
    meminfo = parse_meminfo(read("/proc/meminfo") or "")
    if "MemTotal" in meminfo and "MemAvailable" in meminfo:
        doc["memory_total"] = meminfo["MemTotal"]
        doc["memory_used"] = meminfo["MemTotal"] - meminfo["MemAvailable"]
        sources["memory"] = "/proc/meminfo"
    if "SwapTotal" in meminfo and "SwapFree" in meminfo:
        doc["swap_total"], doc["swap_used"] = meminfo["SwapTotal"], meminfo["SwapTotal"] - meminfo["SwapFree"]
        sources["swap"] = "/proc/meminfo"
    psi = parse_psi(read("/proc/pressure/memory") or "")
    doc["pressure"] = linux_pressure(meminfo, psi)
    if doc["pressure"] is not None:
        sources["pressure"] = "/proc/pressure/memory" if psi else "/proc/meminfo MemAvailable"
    doc["swapouts"] = parse_vmstat_swapouts(read("/proc/vmstat") or "")
    doc["load_1m"] = parse_loadavg(read("/proc/loadavg"))
    if doc["load_1m"] is not None:
        sources["load"] = "/proc/loadavg"
    doc["cores"], sources["cores"] = os.cpu_count(), "os.cpu_count()"
    doc["thermal"], doc["temperature_c"] = linux_thermal(thermal_zones("/sys/class/thermal"))
    if doc["thermal"] is not None:
        sources["thermal"] = "/sys/class/thermal"
    if any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep) if d):
        gpus = parse_nvidia_smi(run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,memory.total,"
                                     "temperature.gpu,power.draw", "--format=csv,noheader,nounits"], errors) or "")

        def figures(key):
            return [g[key] for g in gpus if g[key] is not None]
        if figures("utilization"):
            doc["gpu_percent"], sources["gpu"] = max(figures("utilization")), "nvidia-smi"
        if figures("memory_used") and figures("memory_total"):
            doc["gpu_memory_used"] = int(sum(figures("memory_used")) * 1024 ** 2)
            doc["gpu_memory_total"] = int(sum(figures("memory_total")) * 1024 ** 2)
        if figures("temperature"):
            doc["gpu_temperature_c"] = max(figures("temperature"))
        if figures("power"):
            doc["power_w"], sources["power"] = round(sum(figures("power")), 1), "nvidia-smi"


def thermal_zones(root):
    zones = []
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("thermal_zone"))
    except OSError:
        return zones
    for name in names:
        zone = os.path.join(root, name)
        try:
            temp = int((read(os.path.join(zone, "temp")) or "").strip()) / 1000.0
        except ValueError:
            continue
        if temp <= -273:          # a zone with no sensor behind it
            continue
        trips = []
        try:
            entries = os.listdir(zone)
        except OSError:
            entries = []
        for entry in entries:
            m = re.match(r"^trip_point_(\d+)_type$", entry)
            if m and (read(os.path.join(zone, entry)) or "").strip() == "passive":
                try:
                    trips.append(int((read(os.path.join(zone, "trip_point_%s_temp" % m.group(1))) or "").strip()) / 1000.0)
                except ValueError:
                    pass
        zones.append((temp, min(trips) if trips else None))
    return zones


def disk(workdir):
    """(free, total) bytes of the filesystem holding `workdir` (its nearest existing parent: a workdir not made
    yet is on the disk it will be made on)."""
    path = os.path.abspath(os.path.expanduser(workdir))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def run_lines(text, keep=ARGS_KEPT):
    """The rows of a ps listing that carry a run's token, one line each: the numeric columns, the first `keep`
    characters of the command line, then the run tokens and `MLX_RANK=N` found anywhere in it (a rank's ssh and
    shells carry the whole bootstrap, hundreds of KB that the controller's parser does not need)."""
    rows = []
    for line in (text or "").splitlines():
        if _PS_ROW.match(line):
            rows.append(line)
        elif rows:
            rows[-1] += " " + line          # a command line with a newline in it
    kept = []
    for row in rows:
        if RUN_TOKEN not in row:
            continue
        m = _PS_COLUMNS.match(row)
        if m is None:
            continue
        columns, args = m.groups()
        marks = sorted(set(_TOKEN.findall(args))) + sorted(set(_MLX_RANK.findall(args)))
        kept.append("%s %s%s" % (columns, args[:keep], " ... " + " ".join(marks) if len(args) > keep else ""))
    return "\n".join(kept)


def sample(workdir, ps, system):
    errors = []
    doc = {key: None for key in ("memory_used", "memory_total", "memory_free_percent", "pressure", "swap_used",
                                 "swap_total", "swapouts", "load_1m", "cores", "gpu_percent", "gpu_memory_used",
                                 "gpu_memory_total", "gpu_temperature_c", "thermal", "speed_limit", "thermal_warning",
                                 "temperature_c", "power_w", "disk_free", "disk_total")}
    doc.update(os="macos" if system == "Darwin" else "linux", workdir=workdir, sources={}, errors=errors)
    (macos if system == "Darwin" else linux)(doc, errors)
    try:
        doc["disk_free"], doc["disk_total"] = disk(workdir)
        doc["sources"]["disk"] = "statvfs"
    except OSError as e:
        errors.append("disk: %s" % e)
    listing = run(ps, errors)
    doc["ps"] = run_lines(listing) if listing is not None else None
    if listing is not None:
        doc["sources"]["ranks"] = "ps"
    return doc


def main(argv):
    args, every = argv[1:], None
    if args[:1] == [EVERY]:
        every, args = float(args[1]), args[2:]
    workdir, ps = args[0], args[1:]
    system = (run(["uname", "-s"], []) or os.uname()[0]).strip()
    while True:
        began = time.time()
        try:
            reply(sample(workdir, ps, system))
        except OSError:             # the reader is gone (its connection closed): so are we
            return 0
        if every is None:
            return 0
        time.sleep(max(0.0, began + every - time.time()))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
