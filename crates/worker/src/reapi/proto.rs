//! The wire types the REAPI front door needs beyond `bazel-remote-apis`:
//! the Remote Workers API (`google.devtools.remoteworkers.v1test2`, the
//! `Bots` service an engine hands leases out through), written with
//! prost's derive, field for field as the upstream `.proto` files
//! number them (the same descriptors BuildGrid's generated code carries),
//! and a two-method gRPC client.

pub use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
pub use bazel_remote_apis::google::bytestream as bs;
pub use bazel_remote_apis::google::protobuf::{Any, Duration, Timestamp};
pub use bazel_remote_apis::google::rpc::Status;

/// `google.devtools.remoteworkers.v1test2.BotSession`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct BotSession {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub bot_id: String,
    #[prost(enumeration = "BotStatus", tag = "3")]
    pub status: i32,
    #[prost(message, optional, tag = "4")]
    pub worker: Option<Worker>,
    #[prost(message, repeated, tag = "5")]
    pub leases: Vec<Lease>,
    #[prost(message, optional, tag = "6")]
    pub expire_time: Option<Timestamp>,
    #[prost(string, tag = "7")]
    pub version: String,
}

/// `google.devtools.remoteworkers.v1test2.Lease`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Lease {
    #[prost(string, tag = "7")]
    pub id: String,
    #[prost(message, optional, tag = "8")]
    pub payload: Option<Any>,
    #[prost(message, optional, tag = "9")]
    pub result: Option<Any>,
    #[prost(enumeration = "LeaseState", tag = "2")]
    pub state: i32,
    #[prost(message, optional, tag = "3")]
    pub status: Option<Status>,
    #[prost(message, optional, tag = "4")]
    pub requirements: Option<Worker>,
    #[prost(message, optional, tag = "5")]
    pub expire_time: Option<Timestamp>,
    #[prost(string, tag = "1")]
    pub assignment: String,
    #[prost(message, optional, tag = "6")]
    pub inline_assignment: Option<Any>,
}

/// `google.devtools.remoteworkers.v1test2.Worker`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Worker {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<Device>,
    #[prost(message, repeated, tag = "2")]
    pub properties: Vec<KeyValue>,
    #[prost(message, repeated, tag = "3")]
    pub configs: Vec<KeyValue>,
}

/// `Worker.Property`, `Worker.Config` and `Device.Property` share this shape.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `google.devtools.remoteworkers.v1test2.Device`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Device {
    #[prost(string, tag = "1")]
    pub handle: String,
    #[prost(message, repeated, tag = "2")]
    pub properties: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct CreateBotSessionRequest {
    #[prost(string, tag = "1")]
    pub parent: String,
    #[prost(message, optional, tag = "2")]
    pub bot_session: Option<BotSession>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UpdateBotSessionRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub bot_session: Option<BotSession>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum BotStatus {
    Unspecified = 0,
    Ok = 1,
    Unhealthy = 2,
    HostRebooting = 3,
    BotTerminating = 4,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum LeaseState {
    Unspecified = 0,
    Pending = 1,
    Active = 2,
    Completed = 4,
    Cancelled = 5,
}

pub const TYPE_ACTION: &str = "type.googleapis.com/build.bazel.remote.execution.v2.Action";
pub const TYPE_DIGEST: &str = "type.googleapis.com/build.bazel.remote.execution.v2.Digest";
pub const TYPE_ACTION_RESULT: &str =
    "type.googleapis.com/build.bazel.remote.execution.v2.ActionResult";
pub const TYPE_OUTPUT_FILE: &str = "type.googleapis.com/build.bazel.remote.execution.v2.OutputFile";

/// Pack a message into an `Any`.
pub fn pack<M: prost::Message>(type_url: &str, m: &M) -> Any {
    Any {
        type_url: type_url.to_owned(),
        value: m.encode_to_vec(),
    }
}

/// The `google.rpc.Code` values fhsx reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Code {
    Ok = 0,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    Internal = 13,
    Unavailable = 14,
}

/// A client of the `Bots` service: `CreateBotSession` and `UpdateBotSession`.
#[derive(Debug, Clone)]
pub struct BotsClient {
    inner: tonic::client::Grpc<tonic::transport::Channel>,
}

impl BotsClient {
    pub fn new(channel: tonic::transport::Channel) -> Self {
        BotsClient {
            inner: tonic::client::Grpc::new(channel)
                .max_decoding_message_size(crate::MAX_MESSAGE_BYTES),
        }
    }

    async fn unary<Q, R>(
        &mut self,
        method: &'static str,
        req: tonic::Request<Q>,
    ) -> Result<tonic::Response<R>, tonic::Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        R: prost::Message + Default + Send + Sync + 'static,
    {
        self.inner
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("the Bots service: {e}")))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(method);
        self.inner
            .unary(req, path, tonic_prost::ProstCodec::default())
            .await
    }

    pub async fn create_bot_session(
        &mut self,
        req: tonic::Request<CreateBotSessionRequest>,
    ) -> Result<tonic::Response<BotSession>, tonic::Status> {
        self.unary(
            "/google.devtools.remoteworkers.v1test2.Bots/CreateBotSession",
            req,
        )
        .await
    }

    pub async fn update_bot_session(
        &mut self,
        req: tonic::Request<UpdateBotSessionRequest>,
    ) -> Result<tonic::Response<BotSession>, tonic::Status> {
        self.unary(
            "/google.devtools.remoteworkers.v1test2.Bots/UpdateBotSession",
            req,
        )
        .await
    }
}
