//! The one place that recovers from lock poisoning. A task that panics while it holds a lock
//! poisons it; the daemon must keep running and lose nothing, and every lock's data here
//! (maps, counters, caches, queues) is left whole between statements by its writers, so the
//! lock is taken as it is.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `m` locked, poisoned or not.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `l` read-locked, poisoned or not.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// `l` write-locked, poisoned or not.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex, RwLock};

    #[test]
    fn a_lock_poisoned_by_a_panic_is_taken_as_it_is() {
        let m = Arc::new(Mutex::new(1));
        let l = Arc::new(RwLock::new(2));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            let _w = l2.write();
            panic!("a holder panics");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        *super::lock(&m) += 1;
        *super::write(&l) += 1;
        assert_eq!((*super::lock(&m), *super::read(&l)), (2, 3));
    }
}
