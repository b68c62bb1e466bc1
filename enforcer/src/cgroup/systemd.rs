//! The systemd cgroup driver's effects: transient slice units created, updated and stopped
//! through systemd's D-Bus API (`org.freedesktop.systemd1.Manager`), as kubelet does through
//! runc's `libcontainer/cgroups/systemd`. A slice is started with `Wants=` its parent slice,
//! `DefaultDependencies=no`, accounting on, and the resource properties systemd expresses
//! ([`unit_properties`]); values it does not express (and the exact ones it rounds, such as the
//! cpu quota) are then written to the cgroup files as runc's `Set` does.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use zbus::{
    blocking::{Connection, Proxy},
    zvariant::{OwnedObjectPath, OwnedValue, Value},
};

use super::{CgroupError, CgroupVersion, writer::CgroupValues};
use crate::policy::{cgroup_name::CgroupName, resources::cgroup::shares_to_weight};

const SERVICE: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// How long a start or stop job may take before it is an error (runc waits 30 s).
const JOB_TIMEOUT: Duration = Duration::from_secs(30);

/// One resource property of a unit, as systemd takes it over D-Bus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Property {
    Bool(&'static str, bool),
    U64(&'static str, u64),
    Strings(&'static str, Vec<String>),
    Text(&'static str, String),
}

impl Property {
    fn name(&self) -> &'static str {
        match self {
            Self::Bool(n, _) | Self::U64(n, _) | Self::Strings(n, _) | Self::Text(n, _) => n,
        }
    }

    fn value(&self) -> Value<'_> {
        match self {
            Self::Bool(_, b) => Value::from(*b),
            Self::U64(_, v) => Value::from(*v),
            Self::Strings(_, v) => Value::from(v.clone()),
            Self::Text(_, s) => Value::from(s.as_str()),
        }
    }
}

/// systemd's "infinity" for a resource property.
const INFINITY: u64 = u64::MAX;

/// runc's `CPUQuotaPerSecUSec`: quota per second of wall time, rounded up to 10 ms as systemd
/// keeps it (`quota * 1e6 / period`, infinity when unlimited).
#[must_use]
pub fn cpu_quota_per_sec(quota: Option<i64>, period: u64) -> u64 {
    match quota {
        Some(q) if q > 0 && period > 0 => {
            let per_sec = u64::try_from(q).unwrap_or(0).saturating_mul(1_000_000) / period;
            per_sec.div_ceil(10_000).saturating_mul(10_000)
        }
        _ => INFINITY,
    }
}

/// The resource properties of `values` for a unit on the memory hierarchy's version (v2:
/// `MemoryMax`, `MemoryMin`, `CPUWeight`; v1: `MemoryLimit`, `CPUShares`), with the cpu quota
/// and its period, and `TasksMax`. Unset values are left out (the unit keeps what it has).
#[must_use]
pub fn resource_properties(values: &CgroupValues, version: CgroupVersion) -> Vec<Property> {
    let v2 = version == CgroupVersion::V2;
    let mut out = Vec::new();
    if let Some(limit) = values.memory_limit {
        let bytes = limit.map_or(INFINITY, |b| u64::try_from(b).unwrap_or(0));
        out.push(Property::U64(
            if v2 { "MemoryMax" } else { "MemoryLimit" },
            bytes,
        ));
    }
    if v2 && let Some(min) = values.memory_min {
        out.push(Property::U64("MemoryMin", u64::try_from(min).unwrap_or(0)));
    }
    if v2 && let Some(low) = values.memory_low {
        out.push(Property::U64("MemoryLow", u64::try_from(low).unwrap_or(0)));
    }
    if let Some(shares) = values.cpu_shares {
        out.push(if v2 {
            Property::U64("CPUWeight", shares_to_weight(shares))
        } else {
            Property::U64("CPUShares", shares)
        });
    }
    if let Some(quota) = values.cpu_quota {
        let period = values.cpu_period.unwrap_or(100_000);
        out.push(Property::U64(
            "CPUQuotaPerSecUSec",
            cpu_quota_per_sec(quota, period),
        ));
        if values.cpu_period.is_some() {
            out.push(Property::U64("CPUQuotaPeriodUSec", period));
        }
    }
    if let Some(max) = values.pids_max {
        out.push(Property::U64(
            "TasksMax",
            u64::try_from(max).unwrap_or(INFINITY),
        ));
    }
    out
}

/// Everything a new transient slice is started with (runc's `Apply` for a slice): its
/// description, `Wants=` the parent slice, no default dependencies, accounting on, and the
/// resource properties.
#[must_use]
pub fn unit_properties(
    name: &CgroupName,
    values: &CgroupValues,
    version: CgroupVersion,
) -> Vec<Property> {
    let mut out = vec![
        Property::Text(
            "Description",
            format!("enforcer cgroup {}", name.to_cgroupfs()),
        ),
        Property::Bool("DefaultDependencies", false),
        Property::Bool("MemoryAccounting", true),
        Property::Bool("CPUAccounting", true),
        Property::Bool("TasksAccounting", true),
    ];
    if version == CgroupVersion::V2 {
        out.push(Property::Bool("IOAccounting", true));
    }
    if name.components().len() > 1 {
        out.push(Property::Strings("Wants", vec![name.systemd_parent_unit()]));
    }
    out.extend(resource_properties(values, version));
    out
}

/// The system bus connection to systemd.
#[derive(Clone, Debug)]
pub struct Systemd {
    conn: Connection,
    /// The resource properties last set on each unit: the same values are not sent again
    /// (systemd re-applies every attribute of a controller when one is set, which would undo
    /// what was written to the files since, such as the tripwire's `memory.high`).
    sent: Arc<Mutex<HashMap<String, Vec<Property>>>>,
}

fn bus_err(what: String) -> impl FnOnce(zbus::Error) -> CgroupError {
    move |e| CgroupError::Invalid {
        path: std::path::PathBuf::from(what),
        what: format!("systemd over D-Bus: {e}"),
    }
}

fn is_error(e: &zbus::Error, name: &str) -> bool {
    matches!(e, zbus::Error::MethodError(n, _, _) if n.as_str() == name)
}

impl Systemd {
    /// Connects to the system bus (`/run/dbus/system_bus_socket`) and checks that systemd
    /// answers there.
    pub fn connect() -> Result<Self, CgroupError> {
        let conn = Connection::system().map_err(bus_err("the system bus".to_owned()))?;
        let s = Self {
            conn,
            sent: Arc::default(),
        };
        s.version()?;
        Ok(s)
    }

    fn manager(&self) -> Result<Proxy<'_>, CgroupError> {
        Proxy::new(&self.conn, SERVICE, MANAGER_PATH, MANAGER)
            .map_err(bus_err("systemd's manager".to_owned()))
    }

    /// systemd's version (`Manager.Version`); [`Self::connect`] asks for it to know systemd
    /// answers.
    pub fn version(&self) -> Result<String, CgroupError> {
        self.manager()?
            .get_property::<String>("Version")
            .map_err(bus_err("systemd's Manager.Version".to_owned()))
    }

    /// Starts the slice of `name` with `values` (and waits until it is active), or, when it
    /// exists already, sets its resource properties.
    pub fn ensure_slice(
        &self,
        name: &CgroupName,
        values: &CgroupValues,
        version: CgroupVersion,
    ) -> Result<(), CgroupError> {
        if name.components().is_empty() {
            return Ok(());
        }
        let unit = name.systemd_unit();
        let m = self.manager()?;
        let resources = resource_properties(values, version);
        if self.active_state(&unit)?.as_deref() == Some("active") {
            return self.set_properties(&unit, resources);
        }
        let props = unit_properties(name, values, version);
        let body: Vec<(&str, Value<'_>)> = props.iter().map(|p| (p.name(), p.value())).collect();
        let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
        match m.call::<_, _, OwnedObjectPath>("StartTransientUnit", &(&unit, "replace", body, aux))
        {
            Ok(_) => {}
            Err(e) if is_error(&e, "org.freedesktop.systemd1.UnitExists") => {
                return self.set_properties(&unit, resources);
            }
            Err(e) => return Err(bus_err(format!("StartTransientUnit {unit}"))(e)),
        }
        self.wait_for(&unit, |s| s == Some("active"), "active")?;
        self.sent_lock().insert(unit, resources);
        Ok(())
    }

    fn sent_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Property>>> {
        crate::locks::lock(&self.sent)
    }

    /// `SetUnitProperties` (runtime) with `props`; nothing to set, or the same as last time,
    /// is no call.
    fn set_properties(&self, unit: &str, props: Vec<Property>) -> Result<(), CgroupError> {
        if props.is_empty() || self.sent_lock().get(unit) == Some(&props) {
            return Ok(());
        }
        let body: Vec<(&str, Value<'_>)> = props.iter().map(|p| (p.name(), p.value())).collect();
        self.manager()?
            .call::<_, _, ()>("SetUnitProperties", &(unit, true, body))
            .map_err(bus_err(format!("SetUnitProperties {unit}")))?;
        self.sent_lock().insert(unit.to_owned(), props);
        Ok(())
    }

    /// Stops the slice of `name` (everything in it) and waits until systemd has let it go;
    /// returns whether there was one.
    pub fn stop_slice(&self, name: &CgroupName) -> Result<bool, CgroupError> {
        let unit = name.systemd_unit();
        match self.active_state(&unit)? {
            None => return Ok(false),
            Some(s) if s == "inactive" => return Ok(false),
            Some(_) => {}
        }
        match self
            .manager()?
            .call::<_, _, OwnedObjectPath>("StopUnit", &(&unit, "replace"))
        {
            Ok(_) => {}
            Err(e) if is_error(&e, "org.freedesktop.systemd1.NoSuchUnit") => return Ok(false),
            Err(e) => return Err(bus_err(format!("StopUnit {unit}"))(e)),
        }
        self.wait_for(&unit, |s| s.is_none() || s == Some("inactive"), "stopped")?;
        self.sent_lock().remove(&unit);
        Ok(true)
    }

    /// The unit's `ActiveState`; `None` when systemd has no such unit loaded.
    pub fn active_state(&self, unit: &str) -> Result<Option<String>, CgroupError> {
        let path = match self
            .manager()?
            .call::<_, _, OwnedObjectPath>("GetUnit", &(unit,))
        {
            Ok(p) => p,
            Err(e) if is_error(&e, "org.freedesktop.systemd1.NoSuchUnit") => return Ok(None),
            Err(e) => return Err(bus_err(format!("GetUnit {unit}"))(e)),
        };
        let props = Proxy::new(
            &self.conn,
            SERVICE,
            path.as_str(),
            "org.freedesktop.DBus.Properties",
        )
        .map_err(bus_err(format!("{unit}'s properties")))?;
        match props
            .call::<_, _, OwnedValue>("Get", &("org.freedesktop.systemd1.Unit", "ActiveState"))
        {
            Ok(v) => Ok(String::try_from(v).ok()),
            // The unit went away between the two calls.
            Err(e) if is_error(&e, "org.freedesktop.DBus.Error.UnknownObject") => Ok(None),
            Err(e) => Err(bus_err(format!("{unit}'s ActiveState"))(e)),
        }
    }

    /// Polls the unit's state until `done` holds (the job is systemd's, run after the call
    /// returned), at most [`JOB_TIMEOUT`].
    fn wait_for(
        &self,
        unit: &str,
        done: impl Fn(Option<&str>) -> bool,
        what: &str,
    ) -> Result<(), CgroupError> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            let state = self.active_state(unit)?;
            if done(state.as_deref()) {
                return Ok(());
            }
            if state.as_deref() == Some("failed") || start.elapsed() > JOB_TIMEOUT {
                return Err(CgroupError::Invalid {
                    path: std::path::PathBuf::from(unit),
                    what: format!(
                        "systemd did not get the unit {what} (state {})",
                        state.as_deref().unwrap_or("gone")
                    ),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// runc's `TestCPUQuotaPerSecUSec`-style rounding: up to the next 10 ms.
    #[test]
    fn cpu_quota_is_per_second_rounded_up_to_10ms() {
        assert_eq!(cpu_quota_per_sec(Some(50_000), 100_000), 500_000);
        assert_eq!(cpu_quota_per_sec(Some(1_000), 100_000), 10_000);
        assert_eq!(cpu_quota_per_sec(Some(12_345), 100_000), 130_000);
        assert_eq!(cpu_quota_per_sec(None, 100_000), INFINITY);
        assert_eq!(cpu_quota_per_sec(Some(-1), 100_000), INFINITY);
    }

    #[test]
    fn slice_properties_for_v2_and_v1() {
        let name = CgroupName::from_cgroupfs("/kubepods/burstable/podu-1");
        let v = CgroupValues {
            cpu_shares: Some(512),
            cpu_quota: Some(Some(50_000)),
            cpu_period: Some(100_000),
            memory_limit: Some(Some(64 << 20)),
            memory_min: Some(1 << 20),
            memory_low: Some(2 << 20),
            pids_max: Some(100),
        };
        let props = unit_properties(&name, &v, CgroupVersion::V2);
        let has = |p: Property| props.contains(&p);
        assert!(has(Property::Strings(
            "Wants",
            vec!["kubepods-burstable.slice".into()]
        )));
        assert!(has(Property::Bool("DefaultDependencies", false)));
        assert!(has(Property::U64("MemoryMax", 64 << 20)));
        assert!(has(Property::U64("MemoryMin", 1 << 20)));
        assert!(has(Property::U64("MemoryLow", 2 << 20)));
        assert!(has(Property::U64("CPUWeight", shares_to_weight(512))));
        assert!(has(Property::U64("CPUQuotaPerSecUSec", 500_000)));
        assert!(has(Property::U64("CPUQuotaPeriodUSec", 100_000)));
        assert!(has(Property::U64("TasksMax", 100)));
        let v1 = resource_properties(&v, CgroupVersion::V1);
        assert!(v1.contains(&Property::U64("MemoryLimit", 64 << 20)));
        assert!(v1.contains(&Property::U64("CPUShares", 512)));
        assert!(
            !v1.iter()
                .any(|p| p.name() == "MemoryMin" || p.name() == "MemoryLow")
        );
        // Unlimited is systemd's infinity; unset values are not sent.
        let unlimited = CgroupValues {
            memory_limit: Some(None),
            cpu_quota: Some(None),
            ..CgroupValues::default()
        };
        assert_eq!(
            resource_properties(&unlimited, CgroupVersion::V2),
            [
                Property::U64("MemoryMax", INFINITY),
                Property::U64("CPUQuotaPerSecUSec", INFINITY)
            ]
        );
        // A top-level slice has no parent to want.
        let top = unit_properties(
            &CgroupName::from_cgroupfs("/kubepods"),
            &CgroupValues::default(),
            CgroupVersion::V2,
        );
        assert!(!top.iter().any(|p| p.name() == "Wants"));
    }
}
