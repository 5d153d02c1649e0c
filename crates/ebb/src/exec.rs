//! Futures on a core's event loop: [`spawn`] runs one there, its waker queues it back on that
//! loop (from any thread), and [`oneshot`] carries one result, or the loss of its sender,
//! from one core (or thread) to another. Errors travel as the futures' `Result`s do.
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use crate::event::{self, Remote};

type Task = Pin<Box<dyn Future<Output = ()>>>;

thread_local! {
    /// This loop's futures that are not done, by id (a slot is reused once its future ends).
    static TASKS: RefCell<Vec<Option<Task>>> = const { RefCell::new(Vec::new()) };
    static FREE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

struct TaskWaker {
    id: usize,
    remote: Arc<Remote>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        let id = self.id;
        if event::is_current(&self.remote) {
            event::spawn_local(move || poll_task(id));
        } else {
            self.remote.spawn(move || poll_task(id));
        }
    }
}

/// Runs `fut` on this thread's event loop.
pub fn spawn(fut: impl Future<Output = ()> + 'static) {
    let id = FREE.with(|f| f.borrow_mut().pop()).unwrap_or_else(|| {
        TASKS.with(|t| {
            let mut t = t.borrow_mut();
            t.push(None);
            t.len() - 1
        })
    });
    TASKS.with(|t| t.borrow_mut()[id] = Some(Box::pin(fut)));
    poll_task(id);
}

fn poll_task(id: usize) {
    // Taken out while it runs: it may spawn others, which touch the table.
    let Some(mut fut) = TASKS.with(|t| t.borrow_mut().get_mut(id).and_then(Option::take)) else {
        return; // Woken after it finished, or twice before it ran.
    };
    let waker = Waker::from(Arc::new(TaskWaker {
        id,
        remote: event::remote(),
    }));
    match fut.as_mut().poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(()) => FREE.with(|f| f.borrow_mut().push(id)),
        Poll::Pending => TASKS.with(|t| t.borrow_mut()[id] = Some(fut)),
    }
}

/// The sending half of a [`oneshot`]; dropping it unfulfilled fails the receiver.
pub struct Promise<T> {
    slot: Arc<Mutex<Slot<T>>>,
}

/// The receiving half: a future of the value, or of [`Broken`] if the promise was dropped.
pub struct Receiver<T> {
    slot: Arc<Mutex<Slot<T>>>,
}

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    broken: bool,
}

/// The promise of a [`Receiver`] was dropped without a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the promise was dropped before it was kept")]
pub struct Broken;

pub fn oneshot<T>() -> (Promise<T>, Receiver<T>) {
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        waker: None,
        broken: false,
    }));
    (Promise { slot: slot.clone() }, Receiver { slot })
}

impl<T> Promise<T> {
    pub fn set(self, value: T) {
        let waker = {
            let mut s = self.slot.lock().unwrap();
            s.value = Some(value);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Drop for Promise<T> {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.slot.lock().unwrap();
            if s.value.is_some() {
                return;
            }
            s.broken = true;
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = Result<T, Broken>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.slot.lock().unwrap();
        if let Some(v) = s.value.take() {
            return Poll::Ready(Ok(v));
        }
        if s.broken {
            return Poll::Ready(Err(Broken));
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// A future that is ready once `d` has passed, on this loop's timers.
pub fn sleep(d: Duration) -> Receiver<()> {
    let (p, r) = oneshot();
    event::after(d, move || p.set(()));
    r
}

/// Waits on this thread (one outside any loop: a hosted caller) for `fut`.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Runtime;
    use crate::LoopConfig;

    #[test]
    fn a_future_on_one_core_awaits_work_done_on_another_and_its_errors() {
        let rt = Runtime::start("t", 2, LoopConfig::default(), |_| {}).unwrap();
        let other = rt.remote(1);
        let (done, result) = oneshot::<Result<Vec<usize>, String>>();
        rt.spawn_on(0, move || {
            spawn(async move {
                let mut seen = vec![event::current_core().unwrap()];
                let (p, r) = oneshot();
                other.spawn(move || p.set(event::current_core().unwrap()));
                seen.push(r.await.unwrap());
                sleep(Duration::from_millis(5)).await.unwrap();
                seen.push(event::current_core().unwrap());
                // A promise dropped on the other core fails the future.
                let (p, r) = oneshot::<usize>();
                other.spawn(move || drop(p));
                match r.await {
                    Err(Broken) => done.set(Ok(seen)),
                    Ok(v) => done.set(Err(format!("a dropped promise gave {v}"))),
                }
            })
        });
        assert_eq!(block_on(result).unwrap(), Ok(vec![0, 1, 0]));
        // A closure's result from another core, awaited outside the loops.
        assert_eq!(block_on(rt.call_on(1, event::current_core)), Ok(Some(1)));
    }
}
