// The inbox's and a board's pages: fastpoll's client (fastpoll/fastpoll.js) brings each new answer.
const edge = JSON.parse(document.getElementById("edge-url").textContent);   // fastpoll.edge_url(request)
const show = (id, text) => { document.getElementById(id).textContent = text; };

function showList(id, items) {
  document.getElementById(id).replaceChildren(...items.map(item => {
    const li = document.createElement("li"); li.textContent = item.text; return li; }));
}

if (document.getElementById("poll-url")) {          // a board: the URL carries Django's capability
  fastpoll.subscribe(JSON.parse(document.getElementById("poll-url").textContent), (resource, answer) => {
    show("count", answer.count);
    showList("latest", answer.latest);
  }, {edge, empty: {count: 0, latest: []}, onState: state => show("transport", state)});
} else {
  fastpoll.subscribe(["inbox"], (resource, answer) => {
    show("unread", answer.unread);
    showList("latest", answer.latest);
  }, {edge, empty: {unread: 0, latest: []}, onState: state => show("transport", state)});
}
