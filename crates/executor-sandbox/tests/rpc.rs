//! RPC bridge frame bounds and robustness, against the host-side server.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use executor_sandbox::rpc::{call, read_frame, BasicHandler, RpcLimits, RpcServer};
use executor_sandbox::{Request, Response, RpcHandler, SandboxError, MAX_FRAME};

#[derive(Default)]
struct Counting {
    logs: AtomicUsize,
    bytes: AtomicUsize,
}

impl RpcHandler for Counting {
    fn handle(&self, r: Request) -> Response {
        match r {
            Request::Ping => Response::Pong,
            Request::Log { message, .. } => {
                self.logs.fetch_add(1, Ordering::SeqCst);
                self.bytes.fetch_add(message.len(), Ordering::SeqCst);
                Response::Logged
            }
            Request::Status => Response::Status {
                run_id: "t".into(),
                elapsed_ms: 0,
            },
        }
    }
}

fn server(dir: &Path, limits: RpcLimits) -> (RpcServer, Arc<Counting>) {
    let h = Arc::new(Counting::default());
    let s = RpcServer::bind(&dir.join("wf.sock"), h.clone(), limits).unwrap();
    (s, h)
}

fn connect(s: &RpcServer) -> UnixStream {
    let c = UnixStream::connect(s.path()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c
}

fn still_serves(s: &RpcServer) {
    assert_eq!(
        call(&mut connect(s), &Request::Ping).unwrap(),
        Response::Pong
    );
}

/// A `log` request whose JSON encoding is exactly `len` bytes.
fn log_of_len(len: usize) -> Vec<u8> {
    let base = serde_json::to_vec(&Request::Log {
        level: "info".into(),
        message: String::new(),
    })
    .unwrap()
    .len();
    let body = serde_json::to_vec(&Request::Log {
        level: "info".into(),
        message: "a".repeat(len - base),
    })
    .unwrap();
    assert_eq!(body.len(), len);
    body
}

fn send_raw(c: &UnixStream, len: u32, body: Vec<u8>) -> std::thread::JoinHandle<()> {
    let mut w = c.try_clone().unwrap();
    std::thread::spawn(move || {
        let _ = w.write_all(&len.to_be_bytes());
        let _ = w.write_all(&body);
    })
}

#[test]
fn rpc_frame_of_exactly_one_mib_is_accepted() {
    let d = tempfile::tempdir().unwrap();
    let (s, h) = server(d.path(), RpcLimits::default());
    let mut c = connect(&s);
    let body = log_of_len(MAX_FRAME);
    let t = send_raw(&c, body.len() as u32, body);
    let resp = read_frame(&mut c).unwrap().unwrap();
    t.join().unwrap();
    assert_eq!(
        serde_json::from_slice::<Response>(&resp).unwrap(),
        Response::Logged
    );
    assert_eq!(h.logs.load(Ordering::SeqCst), 1);
    // The same connection keeps working.
    assert_eq!(call(&mut c, &Request::Ping).unwrap(), Response::Pong);
}

#[test]
fn rpc_frame_one_byte_over_is_rejected_and_the_connection_closed() {
    let d = tempfile::tempdir().unwrap();
    let (s, h) = server(d.path(), RpcLimits::default());
    let mut c = connect(&s);
    let body = log_of_len(MAX_FRAME + 1);
    let t = send_raw(&c, body.len() as u32, body);
    let resp = read_frame(&mut c).unwrap().unwrap();
    match serde_json::from_slice::<Response>(&resp).unwrap() {
        Response::Error { message } => assert!(message.contains("1048576"), "{message}"),
        other => panic!("expected an error, got {other:?}"),
    }
    // Closed: nothing more comes.
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    assert!(rest.is_empty());
    let _ = c.shutdown(std::net::Shutdown::Both);
    t.join().unwrap();
    assert_eq!(
        h.logs.load(Ordering::SeqCst),
        0,
        "the oversized request reached the handler"
    );
    // The client side refuses to send one too.
    let e =
        executor_sandbox::rpc::write_frame(&mut Vec::new(), &vec![0; MAX_FRAME + 1]).unwrap_err();
    assert!(matches!(e, SandboxError::FrameTooLarge { .. }));
    still_serves(&s);
}

#[test]
fn rpc_truncated_frames_and_garbage_do_not_crash_the_server() {
    let d = tempfile::tempdir().unwrap();
    let (s, _h) = server(d.path(), RpcLimits::default());
    // Truncated header.
    let mut c = connect(&s);
    c.write_all(&[0, 0]).unwrap();
    drop(c);
    // Truncated body.
    let mut c = connect(&s);
    c.write_all(&100u32.to_be_bytes()).unwrap();
    c.write_all(b"{\"op\":").unwrap();
    drop(c);
    // A well-framed body that is not a request.
    let mut c = connect(&s);
    let junk = b"\xff\xfe garbage";
    c.write_all(&(junk.len() as u32).to_be_bytes()).unwrap();
    c.write_all(junk).unwrap();
    let resp = read_frame(&mut c).unwrap().unwrap();
    assert!(matches!(
        serde_json::from_slice::<Response>(&resp).unwrap(),
        Response::Error { .. }
    ));
    // Unframed text: its first bytes read as a huge length.
    let mut c = connect(&s);
    c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let resp = read_frame(&mut c).unwrap().unwrap();
    assert!(matches!(
        serde_json::from_slice::<Response>(&resp).unwrap(),
        Response::Error { .. }
    ));
    // An unknown op.
    let mut c = connect(&s);
    let body = br#"{"op":"rm_rf"}"#;
    c.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
    c.write_all(body).unwrap();
    let resp = read_frame(&mut c).unwrap().unwrap();
    assert!(matches!(
        serde_json::from_slice::<Response>(&resp).unwrap(),
        Response::Error { .. }
    ));
    // Zero-length frame.
    let mut c = connect(&s);
    c.write_all(&0u32.to_be_bytes()).unwrap();
    let resp = read_frame(&mut c).unwrap().unwrap();
    assert!(matches!(
        serde_json::from_slice::<Response>(&resp).unwrap(),
        Response::Error { .. }
    ));
    still_serves(&s);
}

#[test]
fn rpc_concurrent_connections_are_bounded() {
    let d = tempfile::tempdir().unwrap();
    let limits = RpcLimits {
        max_connections: 4,
        idle_timeout: Duration::from_secs(30),
        ..RpcLimits::default()
    };
    let (s, _h) = server(d.path(), limits);
    // Fill every slot (each proven served by a ping).
    let mut held: Vec<UnixStream> = (0..4)
        .map(|_| {
            let mut c = connect(&s);
            assert_eq!(call(&mut c, &Request::Ping).unwrap(), Response::Pong);
            c
        })
        .collect();
    // The next one is refused with an error and closed.
    let mut extra = connect(&s);
    let resp = read_frame(&mut extra).unwrap().unwrap();
    match serde_json::from_slice::<Response>(&resp).unwrap() {
        Response::Error { message } => assert!(message.contains("too many"), "{message}"),
        other => panic!("expected refusal, got {other:?}"),
    }
    assert!(read_frame(&mut extra).unwrap().is_none());
    // Freeing a slot lets a new client in.
    drop(held.pop());
    let mut ok = false;
    for _ in 0..200 {
        let mut c = connect(&s);
        if let Ok(Response::Pong) = call(&mut c, &Request::Ping) {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(ok, "a freed slot was never reused");
}

/// Past the run's budget of requests every request is refused and its
/// connection closed, on any connection: a flood ends, and the server
/// still stands.
#[test]
fn rpc_a_flood_past_the_budget_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let limits = RpcLimits {
        max_frames: 100,
        ..RpcLimits::default()
    };
    let (s, h) = server(d.path(), limits);
    let mut c = connect(&s);
    for _ in 0..100 {
        assert_eq!(call(&mut c, &Request::Ping).unwrap(), Response::Pong);
    }
    match call(&mut c, &Request::Ping).unwrap() {
        Response::Error { message } => assert!(message.contains("budget"), "{message}"),
        other => panic!("answered past the budget: {other:?}"),
    }
    // A new connection is no way around it.
    let refused = call(
        &mut connect(&s),
        &Request::Log {
            level: "info".into(),
            message: "x".into(),
        },
    )
    .unwrap();
    assert!(matches!(refused, Response::Error { .. }), "{refused:?}");
    assert_eq!(h.logs.load(Ordering::SeqCst), 0);
}

/// A log line's level comes from a closed set, and its message cannot
/// drive a terminal nor start a line of its own: what the handler writes
/// holds no control byte but the newline that ends it.
#[test]
fn rpc_log_lines_are_escaped_and_their_level_is_one_of_a_closed_set() {
    let d = tempfile::tempdir().unwrap();
    let out_path = d.path().join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let h = Arc::new(BasicHandler::new("t").with_output(Some(out)));
    let s = RpcServer::bind(&d.path().join("wf.sock"), h, RpcLimits::default()).unwrap();
    let mut c = connect(&s);
    let forged = Request::Log {
        level: "info".into(),
        message: "ok\x1b]52;c;cHduZWQ=\x07\r\nfhsx: error: forged\u{9b}2J".into(),
    };
    assert_eq!(call(&mut c, &forged).unwrap(), Response::Logged);
    let bad_level = Request::Log {
        level: "info\x1b[2J".into(),
        message: "m".into(),
    };
    match call(&mut c, &bad_level).unwrap() {
        Response::Error { message } => {
            assert!(message.contains("use one of"), "{message}");
            assert!(!message.contains('\x1b'), "{message:?}");
        }
        other => panic!("a level outside the set was taken: {other:?}"),
    }
    drop(s);
    let written = std::fs::read(&out_path).unwrap();
    assert!(
        written.starts_with(b"[sandbox info] ok\\x1b]52"),
        "{written:?}"
    );
    assert_eq!(written.iter().filter(|b| **b == b'\n').count(), 1);
    assert!(
        !written[..written.len() - 1]
            .iter()
            .any(|b| b.is_ascii_control()),
        "{written:?}"
    );
    assert!(!String::from_utf8_lossy(&written).contains('\u{9b}'));
}
